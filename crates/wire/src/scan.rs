//! A BSON element scanner over borrowed bytes: every declared length is checked against the
//! enclosing document before use; values are not decoded until asked for.

pub const DOUBLE: u8 = 0x01;
pub const STRING: u8 = 0x02;
pub const DOCUMENT: u8 = 0x03;
pub const ARRAY: u8 = 0x04;
pub const BOOLEAN: u8 = 0x08;
pub const INT32: u8 = 0x10;
pub const INT64: u8 = 0x12;

/// The first malformation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// One element of a document.
#[derive(Debug, Clone, Copy)]
pub struct Elem<'a> {
    pub tag: u8,
    pub key: &'a [u8],
    /// The value's bytes (for a document or array: the whole embedded document).
    pub value: &'a [u8],
    /// The whole element (type byte, key, value) as a range of the scanned document.
    pub start: usize,
    pub end: usize,
}

/// The elements of one document, in order.
pub struct Elements<'a> {
    doc: &'a [u8],
    at: usize,
    /// Index of the document's terminating NUL.
    end: usize,
}

impl<'a> Elements<'a> {
    /// `doc` must be exactly one document: length prefix equal to `doc.len()`, trailing NUL.
    pub fn new(doc: &'a [u8]) -> Result<Elements<'a>, Malformed> {
        let len = read_i32(doc).ok_or(Malformed("document shorter than 5 bytes"))?;
        if len < 5 || len as usize != doc.len() || doc[doc.len() - 1] != 0 {
            return Err(Malformed("document length or terminator"));
        }
        Ok(Elements {
            doc,
            at: 4,
            end: doc.len() - 1,
        })
    }

    /// Continues a scan of `doc` at `at`, the `end` of an element an earlier scan of the same
    /// document yielded (so the first element is not read twice). An `at` that is not an
    /// element boundary gives errors or nonsense elements, never a panic.
    pub fn resume(doc: &'a [u8], at: usize) -> Result<Elements<'a>, Malformed> {
        let mut elems = Elements::new(doc)?;
        elems.at = at.max(4);
        Ok(elems)
    }

    /// The next element, `None` at the end; after an error the scan stays at the error.
    #[inline(always)]
    pub fn next_elem(&mut self) -> Result<Option<Elem<'a>>, Malformed> {
        if self.at >= self.end {
            return Ok(None);
        }
        let start = self.at;
        let tag = self.doc[start];
        let rest = &self.doc[start + 1..self.end];
        let nul = find_nul(rest).ok_or(Malformed("element key without terminator"))?;
        let vstart = start + 1 + nul + 1;
        let room = &self.doc[vstart..self.end];
        let size = value_size(tag, room)?;
        let vend = vstart + size;
        self.at = vend;
        Ok(Some(Elem {
            tag,
            key: &rest[..nul],
            value: &room[..size],
            start,
            end: vend,
        }))
    }
}

/// The index of the first NUL byte, eight bytes at a time (keys are short, but a byte
/// loop was the largest cost of a scan).
#[inline]
pub fn find_nul(b: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let mut chunks = b.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let w = u64::from_le_bytes(w);
        // The lowest set bit marks the first zero byte (borrows only cause false
        // positives above a real zero byte).
        let zero = w.wrapping_sub(ONES) & !w & HIGHS;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&c| c == 0)
        .map(|p| at + p)
}

/// An array's element at `at` of `b` (the array's elements, its terminator left out) when
/// it is a plain document: type 0x03, a key of at most seven bytes, a length of at least 5
/// that fits in `b`, a terminating NUL; returns where its value starts and where it ends.
/// Anything else is `None`, for the element scanner to read. What it accepts, the scanner
/// accepts with the same bounds.
///
/// `klen` is the key length of the last such element: the value's length is read where
/// that predicts (consecutive array keys are mostly of one length), so the walk from one
/// document to the next waits on one load, not on the search for the key's end, which is
/// checked beside it.
#[inline(always)]
pub fn plain_doc(b: &[u8], at: usize, klen: &mut usize) -> Option<(usize, usize)> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let rest = b.get(at..)?;
    let head = rest.get(..9)?;
    if head[0] != DOCUMENT {
        return None;
    }
    let w = u64::from_le_bytes([
        head[1], head[2], head[3], head[4], head[5], head[6], head[7], head[8],
    ]);
    let nul = ((w.wrapping_sub(ONES) & !w & HIGHS).trailing_zeros() / 8) as usize;
    let mut v = *klen + 2;
    if nul + 2 != v {
        if nul >= 8 {
            return None;
        }
        *klen = nul;
        v = nul + 2;
    }
    let n = read_i32(rest.get(v..)?)?;
    if n < 5 {
        return None;
    }
    let end = v + n as usize;
    if rest.get(end - 1) != Some(&0) {
        return None;
    }
    Some((at + v, at + end))
}

#[inline]
fn read_i32(b: &[u8]) -> Option<i32> {
    Some(i32::from_le_bytes(b.get(..4)?.try_into().ok()?))
}

/// A length-prefixed string (string, code, symbol): int32 n >= 1, then n bytes ending in NUL.
fn string_size(room: &[u8]) -> Result<usize, Malformed> {
    let n = read_i32(room).ok_or(Malformed("string length"))?;
    if n < 1 || n as usize > room.len() - 4 || room[4 + n as usize - 1] != 0 {
        return Err(Malformed("string length or terminator"));
    }
    Ok(4 + n as usize)
}

fn cstring_size(room: &[u8]) -> Result<usize, Malformed> {
    find_nul(room)
        .map(|n| n + 1)
        .ok_or(Malformed("cstring without terminator"))
}

/// The size of a value of type `tag` at the front of `room`, checked to fit in `room`.
#[inline(always)]
pub(crate) fn value_size(tag: u8, room: &[u8]) -> Result<usize, Malformed> {
    let size = match tag {
        0x01 | 0x09 | 0x11 | 0x12 => 8,
        0x10 => 4,
        0x08 => 1,
        0x07 => 12,
        0x13 => 16,
        0x06 | 0x0A | 0x7F | 0xFF => 0,
        0x02 | 0x0D | 0x0E => string_size(room)?,
        0x03 | 0x04 => {
            let n = read_i32(room).ok_or(Malformed("embedded document length"))?;
            if n < 5 || n as usize > room.len() || room[n as usize - 1] != 0 {
                return Err(Malformed("embedded document length or terminator"));
            }
            n as usize
        }
        0x05 => {
            let n = read_i32(room).ok_or(Malformed("binary length"))?;
            if n < 0 {
                return Err(Malformed("negative binary length"));
            }
            5 + n as usize
        }
        0x0B => {
            let pattern = cstring_size(room)?;
            pattern + cstring_size(&room[pattern..])?
        }
        0x0C => string_size(room)? + 12,
        0x0F => {
            let n = read_i32(room).ok_or(Malformed("code with scope length"))?;
            if n < 14 {
                return Err(Malformed("code with scope length"));
            }
            n as usize
        }
        _ => return Err(Malformed("unknown element type")),
    };
    if size > room.len() {
        return Err(Malformed("element overruns its document"));
    }
    Ok(size)
}

/// The text of a string value (`value` as yielded for a string element).
pub fn str_value(value: &[u8]) -> Result<&str, Malformed> {
    let text = value
        .get(4..value.len().saturating_sub(1))
        .ok_or(Malformed("string value"))?;
    std::str::from_utf8(text).map_err(|_| Malformed("string is not utf-8"))
}

pub fn key_str(key: &[u8]) -> Result<&str, Malformed> {
    std::str::from_utf8(key).map_err(|_| Malformed("key is not utf-8"))
}

/// An int32, int64 or whole double as i64; `None` for anything else.
pub fn int_value(e: &Elem<'_>) -> Option<i64> {
    match e.tag {
        INT32 => Some(i32::from_le_bytes(e.value.try_into().ok()?) as i64),
        INT64 => Some(i64::from_le_bytes(e.value.try_into().ok()?)),
        DOUBLE => {
            let d = f64::from_le_bytes(e.value.try_into().ok()?);
            // The range check also rejects NaN; `as` would saturate silently.
            let whole = d.fract() == 0.0 && d >= i64::MIN as f64 && d < i64::MAX as f64;
            whole.then_some(d as i64)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The word-at-a-time NUL search agrees with a byte loop on every input.
        #[test]
        fn find_nul_matches_position(
            b in proptest::collection::vec(
                prop_oneof![Just(0u8), Just(1u8), Just(0x80u8), Just(0xffu8), any::<u8>()],
                0..40,
            )
        ) {
            prop_assert_eq!(super::find_nul(&b), b.iter().position(|&c| c == 0));
        }
    }
}
