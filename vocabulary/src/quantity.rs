//! Kubernetes resource quantities (`10Gi`, `1.5G`, `500M`, `1e9`) as byte counts.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a storage quantity such as \"10Gi\" or \"500M\"")]
pub struct QuantityError(pub String);

/// Parses a quantity into bytes, rounding a fractional byte up (as Kubernetes does for
/// storage) and refusing negative values or anything beyond `u64`.
pub fn parse_bytes(raw: &str) -> Result<u64, QuantityError> {
    let err = || QuantityError(raw.to_owned());
    let text = raw.trim();
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err());
    }
    if !int_part
        .bytes()
        .chain(frac_part.bytes())
        .all(|b| b.is_ascii_digit())
    {
        return Err(err());
    }
    // value = digits * 2^bin * 10^dec / 10^len(frac)
    let (bin, dec): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..].parse().map_err(|_| err())?;
            (0, exp)
        }
        _ => return Err(err()),
    };
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(err());
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| err())?
    };
    let exponent = dec - i32::try_from(frac_part.len()).map_err(|_| err())?;
    if !(-40..=30).contains(&exponent) {
        return Err(err());
    }
    let mut numerator = mantissa.checked_shl(bin).ok_or_else(err)?;
    if numerator >> bin != mantissa {
        return Err(err());
    }
    let mut denominator: u128 = 1;
    if exponent >= 0 {
        numerator = numerator
            .checked_mul(10u128.pow(exponent.unsigned_abs()))
            .ok_or_else(err)?;
    } else {
        let shift = exponent.unsigned_abs();
        if shift > 38 {
            return Ok(u64::from(numerator > 0));
        }
        denominator = 10u128.pow(shift);
    }
    let bytes = numerator.div_ceil(denominator);
    u64::try_from(bytes).map_err(|_| err())
}

/// A quantity in bytes, if it is one.
pub fn bytes(quantity: &Quantity) -> Option<u64> {
    parse_bytes(&quantity.0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_forms() {
        let cases = [
            ("1Gi", 1u64 << 30),
            ("10Gi", 10 << 30),
            ("1.5Gi", 3 << 29),
            ("500M", 500_000_000),
            ("1G", 1_000_000_000),
            ("128974848", 128_974_848),
            ("129e6", 129_000_000),
            ("123Mi", 123 << 20),
            ("1k", 1000),
            ("1Ki", 1024),
            ("0", 0),
            ("1500m", 2),
            ("0.1", 1),
            ("+2Ki", 2048),
            ("8Ei", 8 << 60),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_bytes(raw), Ok(expected), "{raw}");
        }
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        for bad in [
            "", "Gi", "-1Gi", "1GB", "1 Gi", "1.2.3", "16Ei", "1e40", "x", "1e",
        ] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
        // Surrounding whitespace is tolerated.
        assert_eq!(parse_bytes(" 1Gi "), Ok(1 << 30));
    }
}
