//! Numbers as MongoDB compares and computes them: the four numeric BSON types compared by exact
//! value ([`compare`]), the arithmetic of `$inc` and `$mul` (`SafeNum`: an `int` that
//! overflows becomes a `long`, a `long` that overflows is an error), and the sums of `$sum`
//! and `$avg` ([`Sum`]: the widest type seen, `int` -> `long` on overflow -> `double`).
//!
//! Comparisons are exact across types, as MongoDB's are: an `int`, `long` or `double` against
//! another through [`crate::ids::compare`], anything against a `Decimal128` as the rational
//! numbers they are (`NumberDecimal("0.1")` is above the double `0.1`, which is
//! 0.1000000000000000055...). NaN (of either type) sorts below every other number and equals
//! itself; `-0` equals `0`. Arithmetic on `Decimal128` is not done here: [`Arithmetic::Decimal`]
//! says so, and callers refuse it.

use std::cmp::Ordering;

use bson::{Bson, Decimal128};

/// Whether a value is one of the four numeric types.
pub fn is_number(value: &Bson) -> bool {
    matches!(
        value,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)
    )
}

/// Two numbers by exact value; `None` when either is not a number.
pub fn compare(a: &Bson, b: &Bson) -> Option<Ordering> {
    if !is_number(a) || !is_number(b) {
        return None;
    }
    if !matches!(a, Bson::Decimal128(_)) && !matches!(b, Bson::Decimal128(_)) {
        // int, long and double: the exact comparison `_id`s already use.
        return Some(crate::ids::compare(a, b));
    }
    Some(Real::of(a)?.cmp(&Real::of(b)?))
}

/// A Decimal128 decoded from its binary integer decimal (BID) encoding: the value is
/// `(-1)^negative × coefficient × 10^exponent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decimal {
    NaN,
    Infinity {
        negative: bool,
    },
    Finite {
        negative: bool,
        coefficient: u128,
        exponent: i32,
    },
}

const DECIMAL_BIAS: i32 = 6176;
const MAX_COEFFICIENT: u128 = 10u128.pow(34) - 1;

impl Decimal {
    pub fn decode(d: &Decimal128) -> Decimal {
        let bits = u128::from_le_bytes(d.bytes());
        let negative = bits >> 127 == 1;
        let high = (bits >> 64) as u64;
        if (high >> 61) & 0b11 == 0b11 {
            match (high >> 58) & 0b1_1111 {
                0b1_1111 => return Decimal::NaN,
                0b1_1110 => return Decimal::Infinity { negative },
                _ => {}
            }
            // The other "11" form holds a coefficient of at least 2^113, above 10^34 - 1: a
            // non-canonical encoding, which IEEE 754 reads as zero.
            let exponent = ((high >> 47) & 0x3FFF) as i32 - DECIMAL_BIAS;
            return Decimal::Finite {
                negative,
                coefficient: 0,
                exponent,
            };
        }
        let exponent = ((high >> 49) & 0x3FFF) as i32 - DECIMAL_BIAS;
        let mut coefficient = bits & ((1u128 << 113) - 1);
        if coefficient > MAX_COEFFICIENT {
            coefficient = 0;
        }
        Decimal::Finite {
            negative,
            coefficient,
            exponent,
        }
    }
}

/// A number as a point of the extended real line, with NaN below it: finite values are
/// `(-1)^negative × c × 2^p2 × 5^p5`, which every int, long, double and decimal is exactly.
#[derive(Clone, Copy, Debug)]
enum Real {
    NaN,
    NegInfinity,
    Finite {
        negative: bool,
        c: u128,
        p2: i32,
        p5: i32,
    },
    PosInfinity,
}

impl Real {
    fn of(value: &Bson) -> Option<Real> {
        let int = |v: i64| Real::Finite {
            negative: v < 0,
            c: u128::from(v.unsigned_abs()),
            p2: 0,
            p5: 0,
        };
        Some(match value {
            Bson::Int32(v) => int(i64::from(*v)),
            Bson::Int64(v) => int(*v),
            Bson::Double(d) => Real::of_double(*d),
            Bson::Decimal128(d) => match Decimal::decode(d) {
                Decimal::NaN => Real::NaN,
                Decimal::Infinity { negative: true } => Real::NegInfinity,
                Decimal::Infinity { negative: false } => Real::PosInfinity,
                Decimal::Finite {
                    negative,
                    coefficient,
                    exponent,
                } => Real::Finite {
                    negative,
                    c: coefficient,
                    p2: exponent,
                    p5: exponent,
                },
            },
            _ => return None,
        })
    }

    fn of_double(d: f64) -> Real {
        if d.is_nan() {
            return Real::NaN;
        }
        if d.is_infinite() {
            return if d > 0.0 {
                Real::PosInfinity
            } else {
                Real::NegInfinity
            };
        }
        let bits = d.to_bits();
        let biased = ((bits >> 52) & 0x7FF) as i32;
        let fraction = bits & ((1u64 << 52) - 1);
        let (mantissa, exponent) = if biased == 0 {
            (fraction, -1074)
        } else {
            (fraction | (1u64 << 52), biased - 1075)
        };
        Real::Finite {
            negative: d.is_sign_negative(),
            c: u128::from(mantissa),
            p2: exponent,
            p5: 0,
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Real::NaN => 0,
            Real::NegInfinity => 1,
            Real::Finite { .. } => 2,
            Real::PosInfinity => 3,
        }
    }

    fn cmp(&self, other: &Real) -> Ordering {
        match (*self, *other) {
            (
                Real::Finite {
                    negative: na,
                    c: ca,
                    p2: a2,
                    p5: a5,
                },
                Real::Finite {
                    negative: nb,
                    c: cb,
                    p2: b2,
                    p5: b5,
                },
            ) => {
                let sign = |negative: bool, c: u128| match (c, negative) {
                    (0, _) => 0i8,
                    (_, true) => -1,
                    (_, false) => 1,
                };
                let (sa, sb) = (sign(na, ca), sign(nb, cb));
                if sa != sb || sa == 0 {
                    return sa.cmp(&sb);
                }
                let magnitude = magnitude_cmp((ca, a2, a5), (cb, b2, b5));
                if sa < 0 {
                    magnitude.reverse()
                } else {
                    magnitude
                }
            }
            (a, b) => a.rank().cmp(&b.rank()),
        }
    }
}

/// `ca × 2^a2 × 5^a5` against `cb × 2^b2 × 5^b5`, both coefficients non-zero: by their
/// logarithms when those are far apart, else exactly in integers scaled to common exponents
/// (numbers whose logarithms are close have close exponents, so the integers stay small).
fn magnitude_cmp((ca, a2, a5): (u128, i32, i32), (cb, b2, b5): (u128, i32, i32)) -> Ordering {
    const LOG2_5: f64 = 2.321_928_094_887_362;
    let log =
        |c: u128, p2: i32, p5: i32| (c as f64).log2() + f64::from(p2) + f64::from(p5) * LOG2_5;
    let (la, lb) = (log(ca, a2, a5), log(cb, b2, b5));
    // The logarithms are each within far less than 1 of the truth.
    if la - lb > 2.0 {
        return Ordering::Greater;
    }
    if lb - la > 2.0 {
        return Ordering::Less;
    }
    let (m2, m5) = (a2.min(b2), a5.min(b5));
    let scaled = |c: u128, p2: i32, p5: i32| {
        let mut big = Big::from(c);
        big.mul_pow5((p5 - m5) as u32);
        big.shl((p2 - m2) as u32);
        big
    };
    scaled(ca, a2, a5).cmp(&scaled(cb, b2, b5))
}

/// An unsigned integer of any size, little-endian 32-bit limbs, for [`magnitude_cmp`].
#[derive(Debug, PartialEq, Eq)]
struct Big(Vec<u32>);

impl Big {
    fn from(c: u128) -> Big {
        let mut limbs: Vec<u32> = (0..4).map(|i| (c >> (32 * i)) as u32).collect();
        while limbs.last() == Some(&0) {
            limbs.pop();
        }
        Big(limbs)
    }

    fn mul_small(&mut self, m: u32) {
        let mut carry = 0u64;
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }

    fn mul_pow5(&mut self, mut k: u32) {
        const FIVE_13: u32 = 1_220_703_125;
        while k >= 13 {
            self.mul_small(FIVE_13);
            k -= 13;
        }
        if k > 0 {
            self.mul_small(5u32.pow(k));
        }
    }

    fn shl(&mut self, bits: u32) {
        let (limbs, rest) = ((bits / 32) as usize, bits % 32);
        if rest > 0 {
            let mut carry = 0u32;
            for limb in &mut self.0 {
                let v = (u64::from(*limb) << rest) | u64::from(carry);
                *limb = v as u32;
                carry = (v >> 32) as u32;
            }
            if carry > 0 {
                self.0.push(carry);
            }
        }
        if limbs > 0 && !self.0.is_empty() {
            self.0.splice(0..0, std::iter::repeat_n(0, limbs));
        }
    }
}

impl PartialOrd for Big {
    fn partial_cmp(&self, other: &Big) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Big {
    fn cmp(&self, other: &Big) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }
}

/// What `$inc` or `$mul` makes of two numbers.
#[derive(Clone, Debug, PartialEq)]
pub enum Arithmetic {
    Value(Bson),
    /// The result does not fit a `long` (MongoDB fails the update).
    Overflow,
    /// A `Decimal128` operand: not computed here.
    Decimal,
    /// An operand is not a number.
    NotANumber,
}

/// `a + b` as `$inc` computes it (MongoDB's `SafeNum`): two `int`s give an `int`, or a `long`
/// when the sum does not fit; `int`s and `long`s give a `long` (an overflow is an error, not a
/// wrap); a `double` makes the result a `double`.
pub fn add(a: &Bson, b: &Bson) -> Arithmetic {
    arithmetic(a, b, i64::checked_add, |x, y| x + y)
}

/// `a × b` as `$mul` computes it, with the types of [`add`].
pub fn multiply(a: &Bson, b: &Bson) -> Arithmetic {
    arithmetic(a, b, i64::checked_mul, |x, y| x * y)
}

fn arithmetic(
    a: &Bson,
    b: &Bson,
    integer: fn(i64, i64) -> Option<i64>,
    float: fn(f64, f64) -> f64,
) -> Arithmetic {
    if matches!(a, Bson::Decimal128(_)) || matches!(b, Bson::Decimal128(_)) {
        return if is_number(a) && is_number(b) {
            Arithmetic::Decimal
        } else {
            Arithmetic::NotANumber
        };
    }
    let as_f64 = |v: &Bson| match v {
        Bson::Int32(i) => Some(f64::from(*i)),
        Bson::Int64(i) => Some(*i as f64),
        Bson::Double(d) => Some(*d),
        _ => None,
    };
    match (a, b) {
        (Bson::Int32(x), Bson::Int32(y)) => {
            let wide = integer(i64::from(*x), i64::from(*y)).expect("32-bit operands fit 64 bits");
            Arithmetic::Value(match i32::try_from(wide) {
                Ok(narrow) => Bson::Int32(narrow),
                Err(_) => Bson::Int64(wide),
            })
        }
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            let wide = |v: &Bson| match v {
                Bson::Int32(i) => i64::from(*i),
                Bson::Int64(i) => *i,
                _ => unreachable!("matched as an integer"),
            };
            match integer(wide(a), wide(b)) {
                Some(v) => Arithmetic::Value(Bson::Int64(v)),
                None => Arithmetic::Overflow,
            }
        }
        _ => match (as_f64(a), as_f64(b)) {
            (Some(x), Some(y)) => Arithmetic::Value(Bson::Double(float(x, y))),
            _ => Arithmetic::NotANumber,
        },
    }
}

/// The running total of `$sum` and `$avg` in a `$group`: non-numbers are ignored; the result
/// has the widest type summed (`int`, then `long` when the total does not fit an `int`, then
/// `double` when it does not fit a `long`, or when any `double` was summed). Integers are
/// summed exactly and doubles with compensation, as MongoDB's double-double summation does
/// (the last bit of a double total can differ in rare cases).
#[derive(Clone, Debug, Default)]
pub struct Sum {
    widest: Width,
    integers: i128,
    doubles: Compensated,
    count: u64,
    decimal: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Width {
    #[default]
    Int,
    Long,
    Double,
}

/// Neumaier's compensated sum, with the plain sum for infinities and NaN.
#[derive(Clone, Copy, Debug, Default)]
struct Compensated {
    sum: f64,
    compensation: f64,
    naive: f64,
}

impl Compensated {
    fn add(&mut self, x: f64) {
        self.naive += x;
        let t = self.sum + x;
        if self.sum.abs() >= x.abs() {
            self.compensation += (self.sum - t) + x;
        } else {
            self.compensation += (x - t) + self.sum;
        }
        self.sum = t;
    }

    fn value(&self) -> f64 {
        if !self.naive.is_finite() {
            return self.naive;
        }
        self.sum + self.compensation
    }
}

impl Sum {
    /// Adds a value; returns whether it counted (it is a number).
    pub fn add(&mut self, value: &Bson) -> bool {
        match value {
            Bson::Int32(i) => self.integers += i128::from(*i),
            Bson::Int64(i) => {
                self.integers += i128::from(*i);
                self.widest = self.widest.max(Width::Long);
            }
            Bson::Double(d) => {
                self.doubles.add(*d);
                self.widest = Width::Double;
            }
            Bson::Decimal128(_) => self.decimal = true,
            _ => return false,
        }
        self.count += 1;
        true
    }

    /// How many numbers were added.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether a `Decimal128` was added: the total would be a decimal, which is not computed
    /// here.
    pub fn has_decimal(&self) -> bool {
        self.decimal
    }

    /// The total in MongoDB's type (`0` as an `int` when nothing was added).
    pub fn total(&self) -> Bson {
        let fits_long = i64::try_from(self.integers).ok();
        match (self.widest, fits_long) {
            (Width::Int, Some(v)) => match i32::try_from(v) {
                Ok(narrow) => Bson::Int32(narrow),
                Err(_) => Bson::Int64(v),
            },
            (Width::Long, Some(v)) => Bson::Int64(v),
            _ => Bson::Double(self.as_double()),
        }
    }

    /// The mean as `$avg` gives it: a `double`, or `null` when no number was added.
    pub fn average(&self) -> Bson {
        if self.count == 0 {
            return Bson::Null;
        }
        Bson::Double(self.as_double() / self.count as f64)
    }

    fn as_double(&self) -> f64 {
        let mut all = self.doubles;
        let high = self.integers as f64;
        all.add(high);
        // What the conversion of the integers to a double lost, exactly representable.
        all.add((self.integers - high as i128) as f64);
        all.value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn dec(s: &str) -> Bson {
        Bson::Decimal128(Decimal128::from_str(s).unwrap())
    }

    #[test]
    fn decimals_decode_to_their_coefficient_and_exponent() {
        let d = |s: &str| Decimal::decode(&Decimal128::from_str(s).unwrap());
        assert_eq!(
            d("1.5"),
            Decimal::Finite {
                negative: false,
                coefficient: 15,
                exponent: -1
            }
        );
        assert_eq!(
            d("-3E+5"),
            Decimal::Finite {
                negative: true,
                coefficient: 3,
                exponent: 5
            }
        );
        assert_eq!(d("NaN"), Decimal::NaN);
        assert_eq!(d("-Infinity"), Decimal::Infinity { negative: true });
    }

    #[test]
    fn decimals_compare_exactly_with_every_other_number() {
        let cmp = |a: &Bson, b: &Bson| compare(a, b).unwrap();
        assert_eq!(cmp(&dec("1.0"), &Bson::Int32(1)), Ordering::Equal);
        assert_eq!(cmp(&dec("1.00"), &dec("1")), Ordering::Equal);
        assert_eq!(cmp(&dec("2.5"), &Bson::Double(2.5)), Ordering::Equal);
        // The double 0.1 is 0.1000000000000000055511151231257827...: above the decimal 0.1.
        assert_eq!(cmp(&dec("0.1"), &Bson::Double(0.1)), Ordering::Less);
        assert_eq!(
            cmp(
                &dec("0.1000000000000000055511151231257827"),
                &Bson::Double(0.1)
            ),
            Ordering::Less
        );
        assert_eq!(
            cmp(
                &dec("0.1000000000000000055511151231257828"),
                &Bson::Double(0.1)
            ),
            Ordering::Greater
        );
        assert_eq!(
            cmp(&dec("9223372036854775807"), &Bson::Int64(i64::MAX)),
            Ordering::Equal
        );
        assert_eq!(
            cmp(&dec("9223372036854775806"), &Bson::Int64(i64::MAX)),
            Ordering::Less
        );
        assert_eq!(cmp(&dec("-0"), &Bson::Int32(0)), Ordering::Equal);
        assert_eq!(cmp(&dec("-1E-6176"), &Bson::Int32(0)), Ordering::Less);
        assert_eq!(
            cmp(&dec("1E+6144"), &Bson::Double(f64::MAX)),
            Ordering::Greater
        );
        assert_eq!(cmp(&dec("NaN"), &Bson::Double(f64::NAN)), Ordering::Equal);
        assert_eq!(cmp(&dec("NaN"), &dec("-Infinity")), Ordering::Less);
        assert_eq!(
            cmp(&dec("-Infinity"), &Bson::Double(f64::NEG_INFINITY)),
            Ordering::Equal
        );
        assert_eq!(
            cmp(&dec("-Infinity"), &Bson::Int64(i64::MIN)),
            Ordering::Less
        );
        assert_eq!(
            cmp(&Bson::Double(5e-324), &dec("4.9E-324")),
            Ordering::Greater
        );
        assert_eq!(compare(&Bson::Int32(1), &Bson::String("1".into())), None);
    }

    #[test]
    fn inc_keeps_mongodbs_numeric_types() {
        // The update operators page, $inc: "$inc ... int overflow is promoted to long".
        assert_eq!(
            add(&Bson::Int32(i32::MAX), &Bson::Int32(1)),
            Arithmetic::Value(Bson::Int64(i64::from(i32::MAX) + 1))
        );
        assert_eq!(
            add(&Bson::Int32(1), &Bson::Int32(2)),
            Arithmetic::Value(Bson::Int32(3))
        );
        assert_eq!(
            add(&Bson::Int32(1), &Bson::Int64(2)),
            Arithmetic::Value(Bson::Int64(3))
        );
        assert_eq!(
            add(&Bson::Int64(i64::MAX), &Bson::Int32(1)),
            Arithmetic::Overflow
        );
        assert_eq!(
            add(&Bson::Int64(1), &Bson::Double(0.5)),
            Arithmetic::Value(Bson::Double(1.5))
        );
        assert_eq!(
            multiply(&Bson::Int32(65536), &Bson::Int32(65536)),
            Arithmetic::Value(Bson::Int64(1 << 32))
        );
        assert_eq!(add(&dec("1"), &Bson::Int32(1)), Arithmetic::Decimal);
        assert_eq!(
            add(&Bson::String("x".into()), &Bson::Int32(1)),
            Arithmetic::NotANumber
        );
    }

    #[test]
    fn sums_widen_as_group_sums_do() {
        let sum = |values: &[Bson]| {
            let mut s = Sum::default();
            for v in values {
                s.add(v);
            }
            s
        };
        assert_eq!(sum(&[]).total(), Bson::Int32(0));
        assert_eq!(sum(&[]).average(), Bson::Null);
        assert_eq!(
            sum(&[Bson::Int32(1), Bson::Int32(2)]).total(),
            Bson::Int32(3)
        );
        assert_eq!(
            sum(&[Bson::Int32(i32::MAX), Bson::Int32(1)]).total(),
            Bson::Int64(1 << 31)
        );
        assert_eq!(
            sum(&[Bson::Int64(1), Bson::Int32(2)]).total(),
            Bson::Int64(3)
        );
        assert_eq!(
            sum(&[Bson::Int64(i64::MAX), Bson::Int64(1)]).total(),
            Bson::Double(9_223_372_036_854_775_808.0)
        );
        assert_eq!(
            sum(&[Bson::Int32(1), Bson::Double(0.5), Bson::String("x".into())]).total(),
            Bson::Double(1.5)
        );
        let s = sum(&[Bson::Int32(1), Bson::Int32(2), Bson::Null]);
        assert_eq!((s.count(), s.average()), (2, Bson::Double(1.5)));
        // Compensation: 1e16 + 1 + 1 - 1e16 is 2, which a plain double sum loses.
        assert_eq!(
            sum(&[
                Bson::Double(1e16),
                Bson::Double(1.0),
                Bson::Double(1.0),
                Bson::Double(-1e16)
            ])
            .total(),
            Bson::Double(2.0)
        );
        assert_eq!(
            sum(&[Bson::Double(f64::INFINITY), Bson::Int32(1)]).total(),
            Bson::Double(f64::INFINITY)
        );
        assert!(sum(&[dec("1")]).has_decimal());
    }
}
