//! Resource quantities ("10Gi", "500M", "1.5", "2e3") with the value the real API gives
//! them: exact decimal arithmetic, fractions below a nano rounded up (away from zero),
//! binary-suffixed values capped at 2^63-1. Comparisons between spellings of the same
//! amount ("1Gi", "1024Mi", "1073741824") must agree with the real server, or a resize
//! that a real cluster refuses would pass here (and the other way round).

use std::fmt;

use serde_json::Value;

/// The real parser's messages; clients see them inside decode errors.
pub const FORMAT_MSG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const SUFFIX_MSG: &str = "unable to parse quantity's suffix";

const NANOS_PER_UNIT: u128 = 1_000_000_000;
/// Nanos are kept in an i128; amounts beyond it (about 1.7e29 units, far past any disk)
/// saturate instead of wrapping.
const MAX_NANOS: u128 = i128::MAX as u128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantityError {
    /// Not of the form `[+-]digits[.digits][suffix]`.
    Format,
    /// Well formed, but the suffix means nothing (e.g. "1Mk", "1K").
    Suffix,
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuantityError::Format => FORMAT_MSG,
            QuantityError::Suffix => SUFFIX_MSG,
        })
    }
}

impl std::error::Error for QuantityError {}

/// An amount in billionths of a unit (the real type's finest precision).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    nanos: i128,
}

enum Multiplier {
    PowerOfTen(i32),
    PowerOfTwo(u32),
}

/// What a suffix multiplies by.
fn interpret_suffix(suffix: &str) -> Option<Multiplier> {
    use Multiplier::*;
    Some(match suffix {
        "Ki" => PowerOfTwo(10),
        "Mi" => PowerOfTwo(20),
        "Gi" => PowerOfTwo(30),
        "Ti" => PowerOfTwo(40),
        "Pi" => PowerOfTwo(50),
        "Ei" => PowerOfTwo(60),
        "n" => PowerOfTen(-9),
        "u" => PowerOfTen(-6),
        "m" => PowerOfTen(-3),
        "" => PowerOfTen(0),
        "k" => PowerOfTen(3),
        "M" => PowerOfTen(6),
        "G" => PowerOfTen(9),
        "T" => PowerOfTen(12),
        "P" => PowerOfTen(15),
        "E" => PowerOfTen(18),
        s if s.len() > 1 && s.starts_with(['e', 'E']) => PowerOfTen(s[1..].parse().ok()?),
        _ => return None,
    })
}

/// The parts of a quantity string: sign, integer digits (leading zeros dropped), fraction
/// digits, suffix. The scanner is as permissive as the real one: "1.", ".5" and even "Gi"
/// (zero gibibytes) are accepted.
fn split(s: &str) -> Result<(bool, &str, &str, &str), QuantityError> {
    let bytes = s.as_bytes();
    let mut pos = 0;
    let negative = match bytes.first() {
        Some(b'-') => {
            pos = 1;
            true
        }
        Some(b'+') => {
            pos = 1;
            false
        }
        _ => false,
    };
    let digits_from = |from: usize| {
        bytes[from..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(bytes.len(), |n| from + n)
    };
    while bytes.get(pos) == Some(&b'0') {
        pos += 1;
    }
    let int_end = digits_from(pos);
    let integer = &s[pos..int_end];
    pos = int_end;
    let mut fraction = "";
    if bytes.get(pos) == Some(&b'.') {
        let frac_end = digits_from(pos + 1);
        fraction = &s[pos + 1..frac_end];
        pos = frac_end;
    }
    let suffix_start = pos;
    while bytes.get(pos).is_some_and(|b| b"eEinumkKMGTP".contains(b)) {
        pos += 1;
    }
    if matches!(bytes.get(pos), Some(b'+' | b'-')) {
        pos += 1;
    }
    if digits_from(pos) != bytes.len() {
        return Err(QuantityError::Format);
    }
    Ok((negative, integer, fraction, &s[suffix_start..]))
}

/// A non-negative integer of any size, little-endian in base 2^32: just enough arithmetic
/// to scale a quantity's digits exactly, however many the client sent.
struct Natural(Vec<u32>);

impl Natural {
    fn from_digits(digits: &str) -> Natural {
        let mut n = Natural(Vec::new());
        for d in digits.bytes() {
            n.mul_add(10, u32::from(d - b'0'));
        }
        n
    }

    fn is_zero(&self) -> bool {
        self.0.iter().all(|&limb| limb == 0)
    }

    fn mul_add(&mut self, factor: u32, addend: u32) {
        let mut carry = u64::from(addend);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(factor) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }

    /// Divides in place; returns the remainder.
    fn div_rem(&mut self, divisor: u32) -> u32 {
        let mut rem = 0u64;
        for limb in self.0.iter_mut().rev() {
            let v = (rem << 32) | u64::from(*limb);
            *limb = (v / u64::from(divisor)) as u32;
            rem = v % u64::from(divisor);
        }
        rem as u32
    }

    fn to_u128_saturating(&self) -> u128 {
        let significant = self
            .0
            .iter()
            .rposition(|&limb| limb != 0)
            .map_or(0, |i| i + 1);
        if significant > 4 {
            return u128::MAX;
        }
        self.0[..significant]
            .iter()
            .rev()
            .fold(0u128, |acc, &limb| (acc << 32) | u128::from(limb))
    }
}

/// `digits × 2^power × 10^shift`, rounded up to an integer; saturating.
fn scale(digits: &str, power: u32, shift: i64) -> u128 {
    let mut n = Natural::from_digits(digits);
    if n.is_zero() {
        return 0;
    }
    for _ in 0..power {
        n.mul_add(2, 0);
    }
    if shift >= 0 {
        // Past 10^39 the result saturates anyway; stop multiplying there.
        for _ in 0..shift.min(40) {
            n.mul_add(10, 0);
        }
        return n.to_u128_saturating();
    }
    let mut dropped_something = false;
    for _ in 0..shift.unsigned_abs() {
        if n.is_zero() {
            break;
        }
        dropped_something |= n.div_rem(10) != 0;
    }
    n.to_u128_saturating()
        .saturating_add(u128::from(dropped_something))
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        if s.is_empty() {
            return Err(QuantityError::Format);
        }
        let (negative, integer, fraction, suffix) = split(s)?;
        let multiplier = interpret_suffix(suffix).ok_or(QuantityError::Suffix)?;
        let digits = format!("{integer}{fraction}");
        // The fraction's digits were read as whole digits: scale them back down, and up
        // by 10^9 to count nanos.
        let shift = 9 - fraction.len() as i64;
        let magnitude = match multiplier {
            Multiplier::PowerOfTen(exp) => scale(&digits, 0, shift + i64::from(exp)),
            Multiplier::PowerOfTwo(power) => {
                // The real parser caps binary amounts at the largest int64.
                let cap = i64::MAX as u128 * NANOS_PER_UNIT;
                scale(&digits, power, shift).min(cap)
            }
        };
        let nanos = magnitude.min(MAX_NANOS) as i128;
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
        })
    }

    /// A quantity from a JSON value as stored (quantities are strings on the wire).
    pub fn from_json(v: &Value) -> Option<Result<Quantity, QuantityError>> {
        v.as_str().map(Quantity::parse)
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    pub fn is_positive(&self) -> bool {
        self.nanos > 0
    }

    /// The whole number of units, rounded away from zero, as the real `Value()` reports
    /// it in error messages.
    pub fn units_rounded_away_from_zero(&self) -> i128 {
        let units = self.nanos / NANOS_PER_UNIT as i128;
        let rest = self.nanos % NANOS_PER_UNIT as i128;
        units + rest.signum()
    }

    /// The amount as an exact decimal number of nanos: one spelling per amount, for
    /// comparing objects semantically and for remembering what was seen.
    pub fn canonical(&self) -> String {
        self.nanos.to_string()
    }
}

/// The quantity at `keys`, if there is one. Decoding has already refused malformed
/// quantities, so an unparsable one here counts as absent.
pub fn storage_quantity(obj: &Value, keys: &[&str]) -> Option<Quantity> {
    crate::meta::path(obj, keys)
        .and_then(Quantity::from_json)
        .and_then(Result::ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn spellings_of_the_same_amount_are_equal() {
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1Gi"), q("1073741824"));
        assert_eq!(q("1G"), q("1000M"));
        assert_eq!(q("1G"), q("1e9"));
        assert_eq!(q("1.5Gi"), q("1536Mi"));
        assert_eq!(q("0.5"), q("500m"));
        assert_eq!(q("+1k"), q("1000"));
        assert_eq!(q("-0"), Quantity::ZERO);
        assert_eq!(q("Gi"), Quantity::ZERO);
        assert_eq!(q("1."), q("1"));
        assert_eq!(q(".5"), q("500m"));
        assert_eq!(q("2E-3"), q("2m"));
        assert_eq!(q("1E"), q("1e18"));
    }

    #[test]
    fn units_order_amounts() {
        assert!(q("1G") < q("1Gi"));
        assert!(q("1G") > q("953Mi"));
        assert!(q("1023Mi") < q("1Gi"));
        assert!(q("1Ti") > q("1T"));
        assert!(q("-1") < Quantity::ZERO);
        assert!(q("1n") > Quantity::ZERO);
    }

    #[test]
    fn precision_below_a_nano_rounds_up_away_from_zero() {
        assert_eq!(q("0.0000000001"), q("1n"));
        assert_eq!(q("1.0000000001"), q("1000000001n"));
        assert_eq!(q("-0.0000000001"), q("-1n"));
        assert_eq!(q("0.1n"), q("1n"));
        assert_eq!(q("1e-30"), q("1n"));
        assert_eq!(q("0.000000000000000000000000000000000000000001Ki"), q("1n"));
        assert_eq!(q("0.3Ki"), q("307200m"));
    }

    #[test]
    fn binary_amounts_are_capped_at_the_largest_int64() {
        assert_eq!(q("8Ei"), q("9223372036854775807"));
        assert_eq!(q("100Ei"), q("8Ei"));
        assert!(q("10E") > q("8Ei"), "decimal amounts are not capped");
    }

    #[test]
    fn malformed_quantities_are_refused_like_the_real_parser() {
        for bad in ["", "1 Gi", "Gi1x", "1Gib", "abc", "1.2.3", "1e", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert_eq!(Quantity::parse("1Mk"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("1K"), Err(QuantityError::Suffix));
        assert_eq!(Quantity::parse("1 "), Err(QuantityError::Format));
    }

    #[test]
    fn units_for_messages_round_away_from_zero() {
        assert_eq!(q("-0.5").units_rounded_away_from_zero(), -1);
        assert_eq!(q("1.2").units_rounded_away_from_zero(), 2);
        assert_eq!(q("3").units_rounded_away_from_zero(), 3);
    }
}
