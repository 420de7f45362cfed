//! The password file: one `user:$argon2id$...` line per user (PHC strings), `#` comments.
//! Managed by `meridian passwd FILE USER`, which reads the password from stdin.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use argon2::Argon2;
use argon2::password_hash::PasswordHasher;

/// Users and their password hashes.
pub type PasswordDb = HashMap<String, String>;

/// Read a password file. Errors name the line.
pub fn load(path: &Path) -> anyhow::Result<PasswordDb> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read password file {}", path.display()))?;
    parse(&text).with_context(|| format!("password file {}", path.display()))
}

pub fn parse(text: &str) -> anyhow::Result<PasswordDb> {
    let mut db = PasswordDb::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            bail!("line {}: expected `user:hash`", i + 1);
        };
        if user.is_empty() || !hash.starts_with("$argon2") {
            bail!("line {}: expected `user:$argon2...`", i + 1);
        }
        db.insert(user.to_owned(), hash.to_owned());
    }
    Ok(db)
}

/// A PHC string for `password` (Argon2id, default parameters, random salt).
pub fn hash(password: &[u8]) -> anyhow::Result<String> {
    Argon2::default()
        .hash_password(password)
        .map(|h| h.to_string())
        .map_err(|e| anyhow::anyhow!("hashing failed: {e}"))
}

/// The password written to stdin: its first line, without the line ending. `command` shows
/// how to call it in the error for an empty one.
pub fn read_password(command: &str) -> anyhow::Result<String> {
    let mut input = String::new();
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut input)
        .context("cannot read the password from stdin")?;
    let password = input.lines().next().unwrap_or("").to_owned();
    if password.is_empty() {
        bail!("empty password (write it to stdin, e.g. `echo secret | {command}`)");
    }
    Ok(password)
}

/// Equal bytes, compared in a time that depends on their lengths only (bearer tokens).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What checking a password against one hash may cost (`auth.max_hash_memory_kib`,
/// `auth.max_hash_passes`): a hash's own parameters decide it, and a login worker must not be
/// held for hours by one (`t = 4294967295`). Argon2 here runs its lanes one after the other,
/// so the cost is the memory times the passes, whatever the lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashBounds {
    /// The most memory, in KiB (64 MiB; `meridian passwd` uses 19 MiB).
    pub memory_kib: u32,
    /// The most passes over it (`meridian passwd` makes 2).
    pub passes: u32,
}

impl Default for HashBounds {
    fn default() -> Self {
        Self {
            memory_kib: 65_536,
            passes: 10,
        }
    }
}

impl HashBounds {
    /// Whether the PHC string `hash` is an Argon2 hash within these bounds.
    pub fn check(&self, hash: &str) -> Result<(), String> {
        let phc = argon2::password_hash::phc::PasswordHash::new(hash)
            .map_err(|e| format!("not a PHC string: {e}"))?;
        let params =
            argon2::Params::try_from(&phc).map_err(|e| format!("not Argon2 parameters: {e}"))?;
        if params.m_cost() > self.memory_kib || params.t_cost() > self.passes {
            return Err(format!(
                "Argon2 parameters m={},t={} past auth.max_hash_memory_kib = {} or \
                 auth.max_hash_passes = {}",
                params.m_cost(),
                params.t_cost(),
                self.memory_kib,
                self.passes
            ));
        }
        Ok(())
    }
}

/// Whether `password` matches the PHC string `hash`; never for a hash past `bounds`, which is
/// not checked at all.
pub fn verify(password: &[u8], hash: &str, bounds: &HashBounds) -> bool {
    use argon2::password_hash::PasswordVerifier;
    bounds.check(hash).is_ok() && Argon2::default().verify_password(password, hash).is_ok()
}

/// `meridian passwd FILE USER`: create or update USER's line, password from stdin (the first
/// line, without its line ending).
pub fn passwd_command(file: &Path, user: &str) -> anyhow::Result<()> {
    if user.is_empty() || user.contains([':', '\n', '\r']) {
        bail!("a user name must be non-empty and contain no ':' or line breaks");
    }
    let password = read_password("meridian passwd FILE USER")?;
    let existing = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", file.display())),
    };
    // Validate what is there before rewriting it.
    parse(&existing).with_context(|| format!("password file {}", file.display()))?;
    let line = format!("{user}:{}", hash(password.as_bytes())?);
    let mut out = String::new();
    let mut replaced = false;
    for l in existing.lines() {
        if l.trim().split_once(':').is_some_and(|(u, _)| u == user) && !l.trim().starts_with('#') {
            if !replaced {
                out.push_str(&line);
                out.push('\n');
                replaced = true;
            }
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(&line);
        out.push('\n');
    }
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, out).with_context(|| format!("cannot write {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600));
    }
    std::fs::rename(&tmp, file).with_context(|| format!("cannot replace {}", file.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_then_verify() {
        let h = hash(b"secret").unwrap();
        assert!(h.starts_with("$argon2id$"));
        let b = HashBounds::default();
        assert!(verify(b"secret", &h, &b));
        assert!(!verify(b"wrong", &h, &b));
        assert!(!verify(b"secret", "garbage", &b));
    }

    #[test]
    fn parse_names_bad_lines() {
        let db = parse("# users\nalice:$argon2id$x\n\nbob:$argon2id$y\n").unwrap();
        assert_eq!(db.len(), 2);
        let e = parse("alice:$argon2id$x\nbroken\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn hashes_that_would_hold_a_login_worker_are_never_checked() {
        let bounds = HashBounds::default();
        let costly = [
            "$argon2id$v=19$m=19456,t=4294967295,p=1$c2FsdHNhbHQ$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
            "$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHQ$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        ];
        for h in costly {
            let e = bounds.check(h).unwrap_err();
            assert!(e.contains("past auth.max_hash"), "{e}");
            // Refused before any hashing: checking it would hold the test for hours.
            assert!(!verify(b"pw", h, &bounds));
        }
        let h = hash(b"pw").unwrap();
        assert_eq!(bounds.check(&h), Ok(()));
        assert!(verify(b"pw", &h, &bounds));
        let tight = HashBounds {
            memory_kib: 1024,
            passes: 1,
        };
        assert!(!verify(b"pw", &h, &tight));
    }
}
