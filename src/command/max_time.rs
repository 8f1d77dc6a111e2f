//! `maxTimeMS` read as the server reads it (`parseMaxTimeMS`): a number (int32, int64,
//! double or decimal128) whose value, as the server converts it to a 64-bit integer, lies in
//! `[0, 2147483647]`; a double must be integral (NaN is not); a decimal128 is rounded half
//! to even, and its NaN reads as 0. Anything else the server refuses with BadValue, so a
//! read carrying it is never rewritten or counted: it is forwarded untouched and refused.

use crate::wire::scan::{self, Elem};

/// BSON decimal128.
const DECIMAL128: u8 = 0x13;

/// The value the server would run the command with (0: no limit), or `None` when the
/// server refuses the field.
pub(super) fn parse(e: &Elem<'_>) -> Option<i64> {
    let v = match e.tag {
        scan::INT32 => i32::from_le_bytes(e.value.try_into().ok()?) as i64,
        scan::INT64 => i64::from_le_bytes(e.value.try_into().ok()?),
        scan::DOUBLE => {
            let d = f64::from_le_bytes(e.value.try_into().ok()?);
            // Integral (so not NaN) and in range (-0.0 is 0); checked before the cast.
            if d.floor() != d || !(0.0..=i32::MAX as f64).contains(&d) {
                return None;
            }
            d as i64
        }
        DECIMAL128 => decimal128(e.value.try_into().ok()?)?,
        _ => return None,
    };
    (0..=i32::MAX as i64).contains(&v).then_some(v)
}

/// A decimal128 (BSON's little-endian BID encoding) as the server's `safeNumberLong` reads
/// it, rounded half to even, when its value can be in `[0, i32::MAX]`: `Some(0)` for NaN,
/// `None` for infinities and values out of range.
fn decimal128(bytes: [u8; 16]) -> Option<i64> {
    let bits = u128::from_le_bytes(bytes);
    let negative = bits >> 127 == 1;
    let combination = (bits >> 122) & 0x1f;
    if combination == 0x1f {
        // NaN: the server reads it as 0.
        return Some(0);
    }
    if combination == 0x1e {
        return None; // infinity
    }
    let (exponent, coefficient) = if (bits >> 125) & 0b11 == 0b11 {
        // The form for coefficients of 2^113 and more: all above 10^34 - 1, which the
        // standard reads as zero.
        (((bits >> 111) & 0x3fff) as i32, 0u128)
    } else {
        let c = bits & ((1u128 << 113) - 1);
        let c = if c > 9_999_999_999_999_999_999_999_999_999_999_999 {
            0
        } else {
            c
        };
        (((bits >> 113) & 0x3fff) as i32, c)
    };
    let exponent = exponent - 6176;
    let magnitude = if coefficient == 0 {
        0
    } else if exponent >= 0 {
        // 10^10 is already past i32::MAX.
        if exponent > 10 {
            return None;
        }
        coefficient.checked_mul(10u128.pow(exponent as u32))?
    } else {
        let d = -exponent as u32;
        if d > 34 {
            0 // below one half
        } else {
            let p = 10u128.pow(d);
            let (q, r) = (coefficient / p, coefficient % p);
            if 2 * r > p || (2 * r == p && q % 2 == 1) {
                q + 1
            } else {
                q
            }
        }
    };
    match (negative, magnitude) {
        (_, 0) => Some(0),
        (true, _) => None,
        (false, m) => i64::try_from(m).ok().filter(|&v| v <= i32::MAX as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{rawdoc, Bson, Decimal128, RawDocumentBuf};
    use std::str::FromStr;

    fn read(v: Bson) -> Option<i64> {
        let doc = RawDocumentBuf::try_from(&bson::doc! {"maxTimeMS": v}).unwrap();
        let mut elems = scan::Elements::new(doc.as_bytes()).unwrap();
        let e = elems.next_elem().unwrap().unwrap();
        parse(&e)
    }

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(Decimal128::from_str(s).unwrap())
    }

    #[test]
    fn accepts_what_the_server_accepts() {
        let table: Vec<(Bson, Option<i64>)> = vec![
            (Bson::Int32(0), Some(0)),
            (Bson::Int32(500), Some(500)),
            (Bson::Int32(i32::MAX), Some(i32::MAX as i64)),
            (Bson::Int32(-1), None),
            (Bson::Int64(1_000), Some(1_000)),
            (Bson::Int64(i32::MAX as i64), Some(i32::MAX as i64)),
            (Bson::Int64(i32::MAX as i64 + 1), None),
            (Bson::Int64(-5), None),
            (Bson::Int64(i64::MIN), None),
            (Bson::Double(250.0), Some(250)),
            (Bson::Double(0.0), Some(0)),
            (Bson::Double(-0.0), Some(0)),
            (Bson::Double(2147483647.0), Some(i32::MAX as i64)),
            (Bson::Double(2147483648.0), None),
            (Bson::Double(1.5), None),
            (Bson::Double(-1.0), None),
            (Bson::Double(f64::NAN), None),
            (Bson::Double(f64::INFINITY), None),
            (Bson::Double(f64::NEG_INFINITY), None),
            (Bson::Double(1e300), None),
            (Bson::String("500".into()), None),
            (Bson::Boolean(true), None),
            (Bson::Null, None),
            (Bson::Document(bson::doc! {"$numberInt": "5"}), None),
            (Bson::Array(vec![Bson::Int32(5)]), None),
            (dec("500"), Some(500)),
            (dec("5E+2"), Some(500)),
            (dec("500.00"), Some(500)),
            (dec("1.5"), Some(2)),
            (dec("2.5"), Some(2)),
            (dec("2.5000001"), Some(3)),
            (dec("0.4"), Some(0)),
            (dec("-0.4"), Some(0)),
            (dec("-0.6"), None),
            (dec("-1"), None),
            (dec("2147483647"), Some(i32::MAX as i64)),
            (dec("2147483647.4"), Some(i32::MAX as i64)),
            (dec("2147483647.5"), None),
            (dec("2147483648"), None),
            (dec("1E+11"), None),
            (dec("0E+6000"), Some(0)),
            (dec("1E-6000"), Some(0)),
            (dec("NaN"), Some(0)),
            (dec("Infinity"), None),
            (dec("-Infinity"), None),
        ];
        for (v, want) in table {
            assert_eq!(read(v.clone()), want, "{v:?}");
        }
    }

    #[test]
    fn a_classified_read_carries_the_verdict() {
        for (body, ms, invalid) in [
            (
                rawdoc! {"find": "c", "maxTimeMS": 300, "$db": "d"},
                Some(300),
                false,
            ),
            (rawdoc! {"find": "c", "$db": "d"}, None, false),
            (
                rawdoc! {"find": "c", "maxTimeMS": -1, "$db": "d"},
                None,
                true,
            ),
            (
                rawdoc! {"find": "c", "maxTimeMS": 1.5, "$db": "d"},
                None,
                true,
            ),
            (
                rawdoc! {"find": "c", "maxTimeMS": "1", "$db": "d"},
                None,
                true,
            ),
            (
                rawdoc! {"find": "c", "maxTimeMS": 3_000_000_000_i64, "$db": "d"},
                None,
                true,
            ),
        ] {
            let info = super::super::classify(&body).unwrap();
            assert_eq!(
                (info.max_time_ms, info.max_time_invalid),
                (ms, invalid),
                "{body:?}"
            );
            assert_eq!(super::super::is_eligible_shape(&info), !invalid);
        }
    }
}
