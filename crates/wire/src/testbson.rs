//! A small BSON writer for the tests (duplicate keys and odd values are the point, so no
//! library writer).

/// One element: the type byte, the key and its NUL, the value's bytes.
pub(crate) fn el(tag: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut e = vec![tag];
    e.extend_from_slice(key);
    e.push(0);
    e.extend_from_slice(value);
    e
}

/// A document of `elems`, its length and terminator added.
pub(crate) fn doc(elems: &[Vec<u8>]) -> Vec<u8> {
    let len = 5 + elems.iter().map(Vec::len).sum::<usize>();
    let mut d = (len as i32).to_le_bytes().to_vec();
    for e in elems {
        d.extend_from_slice(e);
    }
    d.push(0);
    d
}

/// A string value: its length (with the NUL), the bytes, the NUL.
pub(crate) fn string(s: &[u8]) -> Vec<u8> {
    let mut v = ((s.len() + 1) as i32).to_le_bytes().to_vec();
    v.extend_from_slice(s);
    v.push(0);
    v
}
