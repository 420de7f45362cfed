//! The edge object's link to its home region, as configured: `MERIDIAN_UPSTREAM`, the
//! `ws://` or `wss://` URL of a daemon's edge-link listener (ending in `/link`), and the secret
//! `MERIDIAN_LINK_TOKEN` it presents. With them, the object's broker is a leaf of that daemon
//! (`docs/geo.md`, "Leaves"): its subscribers' interest joins the region's, and messages cross
//! towards interest only, QoS 1/2 exactly once through the outboxes of both ends.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_is_a_websocket_url_to_link_with_a_token() {
        let c =
            LinkConfig::parse("wss://euc1.example.net/link", Some("t0k3n-0123456789ab")).unwrap();
        assert_eq!(c.url, "https://euc1.example.net/link");
        assert_eq!(c.token, "t0k3n-0123456789ab");
        let c = LinkConfig::parse("ws://127.0.0.1:7100/link", Some("x")).unwrap();
        assert_eq!(c.url, "http://127.0.0.1:7100/link");
        for (url, token, says) in [
            ("https://euc1.example.net/link", Some("x"), "ws://"),
            ("ws://127.0.0.1:7100/mqtt", Some("x"), "/link"),
            ("ws:///link", Some("x"), "/link"),
            ("ws://127.0.0.1:7100/link", None, "MERIDIAN_LINK_TOKEN"),
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
