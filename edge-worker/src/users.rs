//! Who may connect: the users listed in the `MQTT_USERS` secret, one `user:password` line each.
//!
//! A Cloudflare secret is stored encrypted and never shown again, so the passwords are kept as
//! given (typically long random tokens for devices) and compared in constant time. A slow
//! password hash would run on the Durable Object's one thread, where every CONNECT with a wrong
//! password would stall every client of the broker.

use std::collections::HashMap;

use meridian_core::broker::{AuthOutcome, AuthRequest, Authenticator};
use meridian_core::codec::ReasonCode;

/// The users and their passwords. Without any, every client may connect.
#[derive(Debug, Clone, Default)]
pub struct Users {
    passwords: HashMap<String, Vec<u8>>,
}

/// A line of `MQTT_USERS` that is not `user:password`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MQTT_USERS line {line}: {problem}")]
pub struct UsersError {
    pub line: usize,
    pub problem: &'static str,
}

impl Users {
    /// Parses `user:password` lines; blank lines and `#` comments are skipped. The password is
    /// everything after the first `:`.
    pub fn parse(text: &str) -> Result<Self, UsersError> {
        let mut passwords = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let error = |problem| UsersError {
                line: index + 1,
                problem,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (user, password) = line
                .split_once(':')
                .ok_or_else(|| error("expected `user:password`"))?;
            if user.is_empty() {
                return Err(error("the user name is empty"));
            }
            if password.is_empty() {
                return Err(error("the password is empty"));
            }
            if passwords
                .insert(user.to_owned(), password.as_bytes().to_vec())
                .is_some()
            {
                return Err(error("this user is listed twice"));
            }
        }
        Ok(Self { passwords })
    }

    pub fn len(&self) -> usize {
        self.passwords.len()
    }

    pub fn is_empty(&self) -> bool {
        self.passwords.is_empty()
    }
}

impl Authenticator for Users {
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        if request.method.is_some() {
            return AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
        }
        if self.passwords.is_empty() {
            return AuthOutcome::Allow { username: None };
        }
        let Some(username) = request.username else {
            return AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED);
        };
        let given = request.password.unwrap_or_default();
        // An unknown user is compared against a password of the same length, so that the time
        // taken does not tell which user names exist.
        let (expected, known) = match self.passwords.get(username) {
            Some(password) => (password.as_slice(), true),
            None => (given, false),
        };
        if equal_in_constant_time(expected, given) && known {
            AuthOutcome::Allow { username: None }
        } else {
            AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
        }
    }
}

/// Whether `a == b`, looking at every byte whatever the first difference (the lengths are not
/// hidden).
fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use meridian_core::ConnId;

    fn request<'a>(username: Option<&'a str>, password: Option<&'a [u8]>) -> AuthRequest<'a> {
        AuthRequest {
            conn: ConnId(1),
            client_id: "c",
            username,
            password,
            method: None,
            data: None,
            tls_identity: None,
            remote_addr: None,
            continuation: false,
            reauthentication: false,
        }
    }

    #[test]
    fn listed_users_get_in_with_their_password_only() {
        let mut users = Users::parse("# devices\nalice:wonder:land\n\n  bob:builder  \n").unwrap();
        assert_eq!(users.len(), 2);
        let allow = AuthOutcome::Allow { username: None };
        let bad = AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        assert_eq!(
            users.authenticate(&request(Some("alice"), Some(b"wonder:land"))),
            allow
        );
        assert_eq!(
            users.authenticate(&request(Some("bob"), Some(b"builder"))),
            allow
        );
        assert_eq!(
            users.authenticate(&request(Some("alice"), Some(b"wonder"))),
            bad
        );
        assert_eq!(
            users.authenticate(&request(Some("alice"), Some(b"builder"))),
            bad
        );
        assert_eq!(users.authenticate(&request(Some("alice"), None)), bad);
        assert_eq!(
            users.authenticate(&request(Some("carol"), Some(b"builder"))),
            bad
        );
        assert_eq!(
            users.authenticate(&request(None, None)),
            AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED)
        );
    }

    #[test]
    fn without_users_everyone_gets_in() {
        let mut users = Users::parse("\n# nobody yet\n").unwrap();
        assert!(users.is_empty());
        assert_eq!(
            users.authenticate(&request(None, None)),
            AuthOutcome::Allow { username: None }
        );
    }

    #[test]
    fn a_bad_line_is_named() {
        let error = |text| Users::parse(text).unwrap_err().to_string();
        assert_eq!(
            error("a:b\nnocolon"),
            "MQTT_USERS line 2: expected `user:password`"
        );
        assert_eq!(
            error(":secret"),
            "MQTT_USERS line 1: the user name is empty"
        );
        assert_eq!(error("a:"), "MQTT_USERS line 1: the password is empty");
        assert_eq!(
            error("a:1\n\na:2"),
            "MQTT_USERS line 3: this user is listed twice"
        );
    }

    #[test]
    fn constant_time_comparison_is_equality() {
        assert!(equal_in_constant_time(b"", b""));
        assert!(equal_in_constant_time(b"abc", b"abc"));
        assert!(!equal_in_constant_time(b"abc", b"abd"));
        assert!(!equal_in_constant_time(b"abc", b"ab"));
    }
}
