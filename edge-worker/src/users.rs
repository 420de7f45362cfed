//! Who may connect: the users listed in the `MQTT_USERS` secret, one `user:password` line each;
//! without it, nobody, unless `ALLOW_ANONYMOUS = "true"` says on purpose that everyone may.
//!
//! A Cloudflare secret is stored encrypted and never shown again, so the passwords are kept as
//! given (typically long random tokens for devices), as SHA-256 digests. A login is checked by
//! comparing the digest of the given password with the user's in constant time, and an
//! unknown user with a digest of the same length: the time taken tells neither which users
//! exist nor how long their passwords are. A slow password hash would run on the Durable
//! Object's one thread, where every CONNECT with a wrong password would stall every client of
//! the broker.

use std::collections::HashMap;

use meridian_core::broker::{AuthOutcome, AuthRequest, Authenticator};
use meridian_core::codec::ReasonCode;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type PasswordDigest = [u8; 32];

/// Who may connect.
#[derive(Debug, Clone, Default)]
pub struct Users {
    who: Who,
}

#[derive(Debug, Clone, Default)]
enum Who {
    /// No user list and no permission for anonymous clients: every CONNECT is refused.
    #[default]
    Nobody,
    /// `ALLOW_ANONYMOUS = "true"` and no user list.
    Anyone,
    /// The users of `MQTT_USERS`, with the digests of their passwords.
    Listed(HashMap<String, PasswordDigest>),
}

/// A line of `MQTT_USERS` that is not `user:password`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("MQTT_USERS line {line}: {problem}")]
pub struct UsersError {
    pub line: usize,
    pub problem: &'static str,
}

fn digest(password: &[u8]) -> PasswordDigest {
    Sha256::digest(password).into()
}

impl Users {
    /// Parses `user:password` lines; blank lines and `#` comments are skipped. The password is
    /// everything after the first `:`. No line at all lets nobody in.
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
                .insert(user.to_owned(), digest(password.as_bytes()))
                .is_some()
            {
                return Err(error("this user is listed twice"));
            }
        }
        Ok(Self {
            who: if passwords.is_empty() {
                Who::Nobody
            } else {
                Who::Listed(passwords)
            },
        })
    }

    /// Everyone may connect, without a user name (`ALLOW_ANONYMOUS = "true"`, no user list).
    pub fn anyone() -> Self {
        Self { who: Who::Anyone }
    }

    /// Nobody may connect (no user list, and anonymous clients not allowed).
    pub fn nobody() -> Self {
        Self { who: Who::Nobody }
    }

    /// Users listed.
    pub fn len(&self) -> usize {
        match &self.who {
            Who::Listed(users) => users.len(),
            Who::Nobody | Who::Anyone => 0,
        }
    }

    /// Whether no user is listed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether anonymous clients get in.
    pub fn allows_anyone(&self) -> bool {
        matches!(self.who, Who::Anyone)
    }
}

impl Authenticator for Users {
    fn authenticate(&mut self, request: &AuthRequest<'_>) -> AuthOutcome {
        if request.method.is_some() {
            return AuthOutcome::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
        }
        let users = match &self.who {
            Who::Anyone => return AuthOutcome::Allow { username: None },
            Who::Nobody => return AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED),
            Who::Listed(users) => users,
        };
        let Some(username) = request.username else {
            return AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED);
        };
        let given = digest(request.password.unwrap_or_default());
        // An unknown user is compared against a digest as long as any other, so that the
        // time taken does not tell which user names exist.
        let (expected, known) = match users.get(username) {
            Some(password) => (password, true),
            None => (&[0u8; 32], false),
        };
        if bool::from(expected.ct_eq(&given)) && known {
            AuthOutcome::Allow { username: None }
        } else {
            AuthOutcome::Deny(ReasonCode::BAD_USER_NAME_OR_PASSWORD)
        }
    }
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
    fn without_users_nobody_gets_in_unless_anyone_may_on_purpose() {
        let mut users = Users::parse("\n# nobody yet\n").unwrap();
        assert!(users.is_empty());
        let refused = AuthOutcome::Deny(ReasonCode::NOT_AUTHORIZED);
        assert_eq!(users.authenticate(&request(None, None)), refused);
        assert_eq!(
            Users::nobody().authenticate(&request(Some("a"), Some(b"b"))),
            refused
        );
        assert_eq!(
            Users::anyone().authenticate(&request(None, None)),
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
    fn passwords_are_kept_as_digests_of_one_length() {
        let users = Users::parse("a:x\nb:a-much-longer-password-than-the-other").unwrap();
        let Who::Listed(map) = &users.who else {
            panic!("listed users")
        };
        assert!(map.values().all(|d| d.len() == 32));
        assert_ne!(map["a"], map["b"]);
        assert!(
            !format!("{users:?}").contains("much-longer"),
            "not kept as given"
        );
    }
}
