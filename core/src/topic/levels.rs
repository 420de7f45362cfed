//! Splitting topics and filters into levels.

/// The '/'-separated levels of a topic or filter: exactly `s.split('/')`, but a plain byte
/// scan, which is several times cheaper for the short levels of real topics.
#[derive(Debug, Clone)]
pub(crate) struct Levels<'a> {
    rest: Option<&'a str>,
}

impl<'a> Levels<'a> {
    #[inline]
    pub(crate) fn new(s: &'a str) -> Self {
        Self { rest: Some(s) }
    }
}

impl<'a> Iterator for Levels<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let s = self.rest?;
        match s.bytes().position(|b| b == b'/') {
            // '/' is ASCII, so both sides of it are char boundaries and `get` always succeeds.
            Some(i) => {
                self.rest = s.get(i + 1..);
                s.get(..i)
            }
            None => {
                self.rest = None;
                Some(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_split_like_str_split() {
        for s in ["", "/", "//", "a", "a/", "/a", "a/b/c", "é/ü//x", "$SYS/#"] {
            assert_eq!(
                Levels::new(s).collect::<Vec<_>>(),
                s.split('/').collect::<Vec<_>>()
            );
        }
    }
}
