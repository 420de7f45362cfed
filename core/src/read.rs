//! One way to read the core's own binary formats, link frames and stored records alike:
//! bounds-checked fields, each failure the format's own error, never a panic and never an
//! allocation beyond what the input holds.
//!
//! A format's reader says where its bytes are ([`Fields::buf`]) and what a failure is
//! ([`Fields::fail`]); the fields come with the trait.

use bytes::Buf;

use crate::retained::{Hlc, Stamp};
use crate::routes::NodeId;

/// Fields read in order from a buffer.
pub(crate) trait Fields {
    /// What is left to read.
    type Buf: Buf;
    /// What a failure is.
    type Error;

    /// The bytes left.
    fn buf(&mut self) -> &mut Self::Buf;

    /// The failure `detail` describes.
    fn fail(&self, detail: &'static str) -> Self::Error;

    /// At least `n` bytes are left, or the input is cut short.
    fn need(&mut self, n: usize) -> Result<(), Self::Error> {
        if self.buf().remaining() < n {
            Err(self.fail("truncated"))
        } else {
            Ok(())
        }
    }

    fn u8(&mut self) -> Result<u8, Self::Error> {
        self.need(1)?;
        Ok(self.buf().get_u8())
    }

    fn u16(&mut self) -> Result<u16, Self::Error> {
        self.need(2)?;
        Ok(self.buf().get_u16())
    }

    fn u32(&mut self) -> Result<u32, Self::Error> {
        self.need(4)?;
        Ok(self.buf().get_u32())
    }

    fn u64(&mut self) -> Result<u64, Self::Error> {
        self.need(8)?;
        Ok(self.buf().get_u64())
    }

    /// A UTF-8 string after its length (u16), without U+0000 (as MQTT's strings).
    fn string(&mut self) -> Result<String, Self::Error> {
        let n = usize::from(self.u16()?);
        self.need(n)?;
        let mut bytes = vec![0; n];
        self.buf().copy_to_slice(&mut bytes);
        let s = String::from_utf8(bytes).map_err(|_| self.fail("string is not UTF-8"))?;
        if s.contains('\0') {
            return Err(self.fail("string contains U+0000"));
        }
        Ok(s)
    }

    /// A node id, as a string.
    fn node(&mut self) -> Result<NodeId, Self::Error> {
        let s = self.string()?;
        NodeId::new(&s).map_err(|_| self.fail("invalid node id"))
    }

    /// A stamp: the clock's milliseconds (u64) and counter (u32), then its node.
    fn stamp(&mut self) -> Result<Stamp, Self::Error> {
        let hlc = Hlc {
            wall_ms: self.u64()?,
            logical: self.u32()?,
        };
        Ok(Stamp {
            hlc,
            node: self.node()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Slice<'a>(&'a [u8]);

    impl<'a> Fields for Slice<'a> {
        type Buf = &'a [u8];
        type Error = &'static str;
        fn buf(&mut self) -> &mut &'a [u8] {
            &mut self.0
        }
        fn fail(&self, detail: &'static str) -> &'static str {
            detail
        }
    }

    #[test]
    fn fields_are_read_in_order_and_never_past_the_end() {
        let mut r = Slice(&[1, 0, 2, 0, 0, 0, 3, 0, 2, b'a', b'b', 0, 1]);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16(), Ok(2));
        assert_eq!(r.u32(), Ok(3));
        assert_eq!(r.string().as_deref(), Ok("ab"));
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u8(), Err("truncated"), "nothing left");
        assert_eq!(Slice(&[0, 3, b'a']).string(), Err("truncated"));
        assert_eq!(
            Slice(&[0, 2, 0xC3, 0x28]).string(),
            Err("string is not UTF-8")
        );
        assert_eq!(Slice(&[0, 1, 0]).string(), Err("string contains U+0000"));
        assert_eq!(Slice(&[0, 0]).node(), Err("invalid node id"));
    }
}
