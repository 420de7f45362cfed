//! Which Durable Object a client meets.
//!
//! - `PLACEMENT = "continent"`: the object of the client's edge location, `edge-<location>`,
//!   created near it (a location hint). The location is the continent of the request's
//!   Cloudflare metadata in lower case (`eu`, `na`, `as`, `af`, `oc`, `sa`, `an`), unless
//!   `EDGE_LOCATIONS` maps the client's country or continent to another: `DE=eu-central`
//!   (a country code), `continent:NA=americas` (a continent), separated by commas or lines. A
//!   client may pin a location with `/mqtt?location=NAME`; an unknown name gets 404. A request
//!   without location metadata (local development) meets the object `BROKER_NAME`.
//! - `PLACEMENT = "single"`: every client meets the object `BROKER_NAME`.
//!
//! The default is `continent` when the objects are linked (to a region, `MERIDIAN_UPSTREAM`,
//! or to a hub object, `EDGE_HUB`), which joins them, and `single` otherwise: objects of
//! different locations with nothing between them would split the clients into islands.

use std::collections::{BTreeMap, BTreeSet};

/// The continents of Cloudflare's request metadata, as location names, with the location hint
/// that places an object there.
const CONTINENTS: &[(&str, Option<&str>)] = &[
    ("af", Some("afr")),
    ("an", None),
    ("as", Some("apac")),
    ("eu", Some("weur")),
    ("na", Some("enam")),
    ("oc", Some("oc")),
    ("sa", Some("sam")),
];

/// Leaves a hub object takes (one per edge location, and the object of requests without
/// location metadata), which bounds the locations of an edge-only deployment.
pub const HUB_MAX_LEAVES: usize = 16;

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The Durable Object's name.
    pub object: String,
    /// The location hint for an object created by this request.
    pub hint: Option<&'static str>,
}

/// How clients are spread over objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The object of `PLACEMENT = "single"`, and of requests without location metadata.
    single: String,
    /// `None`: one object only.
    locations: Option<Locations>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Locations {
    /// Country code (upper case) to location.
    countries: BTreeMap<String, String>,
    /// Continent code (upper case) to location.
    continents: BTreeMap<String, String>,
    /// Every location a client may pin.
    known: BTreeSet<String>,
}

impl Placement {
    /// From `PLACEMENT`, `EDGE_LOCATIONS` and `BROKER_NAME`; `linked`: the objects link to a
    /// region or a hub. An error names the variable and what is wrong.
    pub fn parse(
        placement: Option<&str>,
        locations: Option<&str>,
        single: &str,
        linked: bool,
    ) -> Result<Self, String> {
        let by_location = match placement.map(str::trim).filter(|p| !p.is_empty()) {
            None => linked,
            Some("continent") => true,
            Some("single") => false,
            Some(other) => {
                return Err(format!(
                    "PLACEMENT: \"continent\" or \"single\", not {other:?}"
                ));
            }
        };
        let single = single.to_owned();
        if !by_location {
            if locations.is_some_and(|l| !l.trim().is_empty()) {
                return Err("EDGE_LOCATIONS is set but PLACEMENT is \"single\"".to_owned());
            }
            return Ok(Self {
                single,
                locations: None,
            });
        }
        let mut map = Locations {
            countries: BTreeMap::new(),
            continents: BTreeMap::new(),
            known: CONTINENTS.iter().map(|(c, _)| (*c).to_owned()).collect(),
        };
        for entry in locations
            .unwrap_or_default()
            .split([',', '\n'])
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.starts_with('#'))
        {
            let bad = || {
                format!(
                    "EDGE_LOCATIONS: {entry:?} is not COUNTRY=location or continent:CODE=location \
                     (codes of two letters; locations of a-z, 0-9 and -, at most 32)"
                )
            };
            let (key, location) = entry.split_once('=').ok_or_else(bad)?;
            let (key, location) = (key.trim(), location.trim());
            if !valid_location(location) {
                return Err(bad());
            }
            let (table, code) = match key.strip_prefix("continent:") {
                Some(code) => (&mut map.continents, code),
                None => (&mut map.countries, key),
            };
            if code.len() != 2 || !code.chars().all(|c| c.is_ascii_alphabetic()) {
                return Err(bad());
            }
            table.insert(code.to_ascii_uppercase(), location.to_owned());
            map.known.insert(location.to_owned());
        }
        Ok(Self {
            single,
            locations: Some(map),
        })
    }

    /// The object for a request: the pinned location, else the client's country's, else its
    /// continent's. `Err` with the reason for a location nobody configured.
    pub fn target(
        &self,
        pinned: Option<&str>,
        country: Option<&str>,
        continent: Option<&str>,
    ) -> Result<Target, String> {
        let Some(map) = &self.locations else {
            return match pinned {
                None => Ok(self.single_target()),
                Some(_) => Err(
                    "this deployment runs one broker (PLACEMENT = \"single\"): no ?location"
                        .to_owned(),
                ),
            };
        };
        let hint_of = |continent: Option<&str>| {
            let continent = continent?.to_ascii_lowercase();
            CONTINENTS
                .iter()
                .find(|(c, _)| *c == continent)
                .and_then(|(_, h)| *h)
        };
        if let Some(location) = pinned {
            if !map.known.contains(location) {
                return Err(format!(
                    "unknown location {location:?}; known: {}",
                    map.known.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            // A continent's own name places its object there; another, near the client.
            let hint = hint_of(Some(location)).or_else(|| hint_of(continent));
            return Ok(Target {
                object: format!("edge-{location}"),
                hint,
            });
        }
        let by_country = country.and_then(|c| map.countries.get(&c.to_ascii_uppercase()));
        let by_continent = continent.and_then(|c| {
            map.continents
                .get(&c.to_ascii_uppercase())
                .cloned()
                .or_else(|| {
                    let c = c.to_ascii_lowercase();
                    map.known.contains(&c).then_some(c)
                })
        });
        match by_country.cloned().or(by_continent) {
            Some(location) => Ok(Target {
                object: format!("edge-{location}"),
                hint: hint_of(continent),
            }),
            None => Ok(self.single_target()),
        }
    }

    /// The hub object of an edge-only deployment (`EDGE_HUB`): the object of that location,
    /// which clients there meet too.
    pub fn hub(&self, location: &str) -> Result<Target, String> {
        let Some(map) = &self.locations else {
            return Err(
                "EDGE_HUB is set but PLACEMENT is \"single\": one object has nothing to link"
                    .to_owned(),
            );
        };
        // Every other location's object links to the hub, and so does the object of requests
        // without location metadata.
        let leaves = map.known.len();
        if leaves > HUB_MAX_LEAVES {
            return Err(format!(
                "EDGE_HUB: {leaves} objects would link to the hub (the {} other locations, the \
                 seven continents' and EDGE_LOCATIONS', and the object of requests without \
                 location metadata), which takes at most {HUB_MAX_LEAVES}: name fewer locations",
                leaves - 1
            ));
        }
        self.target(Some(location.trim()), None, None)
            .map_err(|e| format!("EDGE_HUB: {e}"))
    }

    fn single_target(&self) -> Target {
        Target {
            object: self.single.clone(),
            hint: None,
        }
    }
}

fn valid_location(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(object: &str, hint: Option<&'static str>) -> Result<Target, String> {
        Ok(Target {
            object: object.to_owned(),
            hint,
        })
    }

    #[test]
    fn one_object_per_continent_when_linked() {
        let p = Placement::parse(None, None, "meridian", true).unwrap();
        assert_eq!(
            p.target(None, Some("DE"), Some("EU")),
            target("edge-eu", Some("weur"))
        );
        assert_eq!(
            p.target(None, Some("JP"), Some("AS")),
            target("edge-as", Some("apac"))
        );
        assert_eq!(
            p.target(Some("na"), Some("DE"), Some("EU")),
            target("edge-na", Some("enam"))
        );
        assert_eq!(
            p.target(None, None, None),
            target("meridian", None),
            "no metadata"
        );
        let e = p.target(Some("mars"), None, None).unwrap_err();
        assert!(
            e.contains("unknown location \"mars\"") && e.contains("eu"),
            "{e}"
        );
    }

    #[test]
    fn one_object_unless_linked_or_asked() {
        let p = Placement::parse(None, None, "meridian", false).unwrap();
        assert_eq!(
            p.target(None, Some("DE"), Some("EU")),
            target("meridian", None)
        );
        assert!(p.target(Some("eu"), None, None).is_err());
        let p = Placement::parse(Some("continent"), None, "meridian", false).unwrap();
        assert_eq!(
            p.target(None, None, Some("EU")),
            target("edge-eu", Some("weur"))
        );
        let p = Placement::parse(Some("single"), None, "b", true).unwrap();
        assert_eq!(p.target(None, None, Some("EU")), target("b", None));
    }

    #[test]
    fn the_hub_of_an_edge_only_deployment_is_a_known_location() {
        let p = Placement::parse(None, Some("DE=eu-central"), "meridian", true).unwrap();
        assert_eq!(p.hub("eu"), target("edge-eu", Some("weur")));
        assert_eq!(p.hub("eu-central"), target("edge-eu-central", None));
        let e = p.hub("mars").unwrap_err();
        assert!(e.starts_with("EDGE_HUB: unknown location"), "{e}");
        let single = Placement::parse(Some("single"), None, "meridian", true).unwrap();
        assert!(single.hub("eu").unwrap_err().contains("PLACEMENT"));
        // The seven continents and nine locations more: 15 others and the object of requests
        // without metadata are 16 leaves, as many as a hub takes; one location more is too many.
        let named = |n: usize| {
            (0..n)
                .map(|i| format!("Q{}=loc-{i}", char::from(b'A' + i as u8)))
                .collect::<Vec<_>>()
                .join(",")
        };
        let p = Placement::parse(None, Some(&named(9)), "meridian", true).unwrap();
        assert!(p.hub("eu").is_ok());
        let p = Placement::parse(None, Some(&named(10)), "meridian", true).unwrap();
        let e = p.hub("eu").unwrap_err();
        assert!(e.contains("17 objects") && e.contains("at most 16"), "{e}");
    }

    #[test]
    fn countries_and_continents_map_to_other_locations() {
        let p = Placement::parse(
            None,
            Some("DE=eu-central, FR=eu-central\ncontinent:NA=americas, continent:SA=americas"),
            "meridian",
            true,
        )
        .unwrap();
        assert_eq!(
            p.target(None, Some("DE"), Some("EU")),
            target("edge-eu-central", Some("weur"))
        );
        assert_eq!(
            p.target(None, Some("IT"), Some("EU")),
            target("edge-eu", Some("weur"))
        );
        assert_eq!(
            p.target(None, Some("BR"), Some("SA")),
            target("edge-americas", Some("sam"))
        );
        assert_eq!(
            p.target(Some("americas"), None, Some("EU")),
            target("edge-americas", Some("weur"))
        );
        for bad in ["DE", "DEU=x", "DE=Upper", "continent:EUR=x", "DE="] {
            let e = Placement::parse(None, Some(bad), "m", true).unwrap_err();
            assert!(e.starts_with("EDGE_LOCATIONS"), "{bad}: {e}");
        }
        assert!(Placement::parse(Some("everywhere"), None, "m", true).is_err());
    }
}
