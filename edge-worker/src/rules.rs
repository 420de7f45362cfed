//! Access rules at the edge: the `MQTT_ACL` secret or variable holds the `[acl]` section of a
//! Meridian configuration file, exactly as the daemon reads it (`default`, then `[[acl.rules]]`
//! tables of `permission`, `action`, `topic`, `user`, `client_id`; `%u` and `%c` stand for the
//! user name and the client id), and the core's rule engine ([`meridian_core::acl`]) applies
//! them. Without it every user may use every topic.

use meridian_core::acl::Acl;

/// The text of `MQTT_ACL`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AclText {
    acl: Acl,
}

/// The rules of `text`, or what is wrong with them, with its line.
pub fn parse(text: &str) -> Result<Acl, String> {
    toml::from_str::<AclText>(text)
        .map(|t| t.acl)
        .map_err(|e| format!("MQTT_ACL: {}", e.to_string().trim_end()))
}

#[cfg(test)]
mod tests {
    use meridian_core::acl::{ClientRef, FilterAccess, Permission};

    use super::*;

    #[test]
    fn the_daemons_acl_section_reads_the_same() {
        let acl = parse(
            "[acl]\ndefault = \"deny\"\n\n[[acl.rules]]\npermission = \"allow\"\naction = \"all\"\n\
             topic = \"devices/%u/#\"\n",
        )
        .unwrap();
        assert_eq!(acl.default_permission(), Permission::Deny);
        let alice = ClientRef {
            client_id: "c1",
            username: Some("alice"),
        };
        assert!(acl.may_publish(&alice, "devices/alice/t"));
        assert!(!acl.may_publish(&alice, "devices/bob/t"));
        assert_eq!(
            acl.filter_access(&alice, "devices/#"),
            FilterAccess::Filtered
        );
    }

    #[test]
    fn a_bad_rule_is_named_with_its_line() {
        let error = parse(
            "[acl]\ndefault = \"allow\"\n[[acl.rules]]\npermission = \"deny\"\naction = \"all\"\n\
             topic = \"a/#/b\"\n",
        )
        .unwrap_err();
        assert!(error.starts_with("MQTT_ACL: "), "{error}");
        assert!(error.contains("line 3"), "{error}");
        assert!(error.contains("a/#/b"), "{error}");
        let error = parse("[acl]\ndefault = \"maybe\"\n").unwrap_err();
        assert!(
            error.contains("line 2") && error.contains("maybe"),
            "{error}"
        );
        assert!(
            parse("default = \"allow\"\n").is_err(),
            "the [acl] table is needed"
        );
    }
}
