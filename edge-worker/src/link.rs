//! What an edge object links to, as configured (`docs/geo.md`, "Leaves"): each object is a
//! leaf of a hub, its subscribers' interest joins the hub's, and messages cross towards
//! interest only, QoS 1/2 exactly once through the outboxes of both ends.
//!
//! - `MERIDIAN_UPSTREAM`, the `ws://` or `wss://` URL of a daemon's edge-link listener (ending
//!   in `/link`), and the secret `MERIDIAN_LINK_TOKEN` it presents: every object is a leaf of
//!   that daemon, and through it reaches the daemon's region and the whole mesh.
//! - `EDGE_HUB`, a location: with no daemon at all, the object of that location is the hub
//!   and every other object is its leaf, linked through the hub's Durable Object stub.

use crate::placement::Target;

/// What an object links to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uplink {
    /// A daemon's edge-link listener.
    Region(LinkConfig),
    /// The hub object of an edge-only deployment.
    Hub(Target),
}

impl Uplink {
    /// From `MERIDIAN_UPSTREAM` with `MERIDIAN_LINK_TOKEN`, and from `EDGE_HUB` (as placed):
    /// one of them, or neither.
    pub fn parse(
        upstream: Option<&str>,
        token: Option<&str>,
        hub: Option<Target>,
    ) -> Result<Option<Self>, String> {
        match (upstream.filter(|u| !u.trim().is_empty()), hub) {
            (Some(_), Some(_)) => Err(
                "MERIDIAN_UPSTREAM and EDGE_HUB are both set: objects link to a region's daemon \
                 or to a hub object, not both"
                    .to_owned(),
            ),
            (Some(url), None) => Ok(Some(Self::Region(LinkConfig::parse(url, token)?))),
            (None, Some(hub)) => Ok(Some(Self::Hub(hub))),
            (None, None) => Ok(None),
        }
    }
}

/// Where the edge object links to, and with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkConfig {
    /// The listener's URL as fetch takes it for an upgrade (`http://` or `https://`).
    pub url: String,
    /// The bearer token.
    pub token: String,
}

impl LinkConfig {
    /// From the variable's and the secret's values; an error names what is wrong.
    pub fn parse(upstream: &str, token: Option<&str>) -> Result<Self, String> {
        let (scheme, rest) = upstream
            .split_once("://")
            .ok_or_else(|| format!("MERIDIAN_UPSTREAM: a ws:// or wss:// URL, not {upstream:?}"))?;
        let scheme = match scheme {
            "ws" => "http",
            "wss" => "https",
            _ => {
                return Err(format!(
                    "MERIDIAN_UPSTREAM: a ws:// or wss:// URL, not {upstream:?}"
                ));
            }
        };
        let path_ok = rest
            .split_once('/')
            .is_some_and(|(host, path)| !host.is_empty() && path.trim_end_matches('/') == "link");
        if !path_ok {
            return Err(format!(
                "MERIDIAN_UPSTREAM: the daemon's edge-link listener, ending in /link, not {upstream:?}"
            ));
        }
        if scheme == "http" && !on_loopback(rest) {
            return Err(format!(
                "MERIDIAN_UPSTREAM: ws:// would send the link token and every message in clear; \
                 use wss:// (ws:// is for a daemon on this machine's loopback), not {upstream:?}"
            ));
        }
        let token = token.map(str::trim).unwrap_or_default();
        if token.is_empty() {
            return Err(
                "MERIDIAN_LINK_TOKEN is not set: the daemon refuses an edge link without its token"
                    .to_owned(),
            );
        }
        Ok(Self {
            url: format!("{scheme}://{rest}"),
            token: token.to_owned(),
        })
    }
}

/// Whether the host of `rest` (what follows `scheme://`) is a loopback address: `localhost`,
/// 127.0.0.0/8 or `[::1]`.
fn on_loopback(rest: &str) -> bool {
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_links_to_a_region_or_to_a_hub_not_both() {
        let hub = Target {
            object: "edge-eu".to_owned(),
            hint: Some("weur"),
        };
        let url = "ws://127.0.0.1:7100/link";
        assert_eq!(Uplink::parse(None, None, None), Ok(None));
        assert_eq!(Uplink::parse(Some(""), None, None), Ok(None));
        assert_eq!(
            Uplink::parse(None, None, Some(hub.clone())),
            Ok(Some(Uplink::Hub(hub.clone())))
        );
        assert!(matches!(
            Uplink::parse(Some(url), Some("t"), None),
            Ok(Some(Uplink::Region(_)))
        ));
        let e = Uplink::parse(Some(url), Some("t"), Some(hub)).unwrap_err();
        assert!(e.contains("not both"), "{e}");
    }

    #[test]
    fn an_upstream_is_a_websocket_url_to_link_with_a_token() {
        let c =
            LinkConfig::parse("wss://euc1.example.net/link", Some("t0k3n-0123456789ab")).unwrap();
        assert_eq!(c.url, "https://euc1.example.net/link");
        assert_eq!(c.token, "t0k3n-0123456789ab");
        let c = LinkConfig::parse("ws://127.0.0.1:7100/link", Some("x")).unwrap();
        assert_eq!(c.url, "http://127.0.0.1:7100/link");
        for loopback in [
            "ws://localhost:7100/link",
            "ws://[::1]:7100/link",
            "ws://127.8.0.1/link",
        ] {
            assert!(LinkConfig::parse(loopback, Some("x")).is_ok(), "{loopback}");
        }
        for (url, token, says) in [
            ("https://euc1.example.net/link", Some("x"), "ws://"),
            ("ws://127.0.0.1:7100/mqtt", Some("x"), "/link"),
            ("ws:///link", Some("x"), "/link"),
            ("ws://127.0.0.1:7100/link", None, "MERIDIAN_LINK_TOKEN"),
            ("ws://euc1.example.net/link", Some("x"), "wss://"),
            ("ws://10.0.0.7:7100/link", Some("x"), "in clear"),
            (
                "ws://127.0.0.1:7100/link",
                Some("  "),
                "MERIDIAN_LINK_TOKEN",
            ),
        ] {
            let e = LinkConfig::parse(url, token).unwrap_err();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
