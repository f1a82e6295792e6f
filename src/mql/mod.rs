//! MongoDB's query language as the front evaluates it on documents it has merged from several
//! locations: the order of BSON values ([`order`]), dotted paths ([`path`]), sort
//! specifications ([`sort`]), find projections ([`projection`]), update documents and the
//! document an upsert inserts ([`update`]), the aggregation stages the front runs itself
//! ([`pipeline`]), and what a filter pins a field to before any I/O ([`filter`]).
//!
//! Pure: no I/O, no async, no clock. Every rule is MongoDB 7.0's as documented (and, where the
//! documentation is silent, as its source does it); the tests cite the rule they check. What
//! the front does not evaluate is refused before any I/O with [`MqlError::not_implemented`],
//! naming what is supported, never approximated silently.
//!
//! Errors are MongoDB's: the code, the `codeName` and, where MongoDB has one, its wording, so a
//! driver that branches on the code behaves as it does against a `mongos`.

pub mod filter;
pub mod number;
pub mod order;
pub mod path;
pub mod pipeline;
pub mod projection;
pub mod sort;
pub mod update;

mod text;

pub use text::{shell, type_name};

/// An error as MongoDB reports it: its code number, codeName and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code_name} {code})")]
pub struct MqlError {
    pub code: i32,
    pub code_name: &'static str,
    pub message: String,
}

impl MqlError {
    fn new(code: i32, code_name: &'static str, message: impl Into<String>) -> MqlError {
        MqlError {
            code,
            code_name,
            message: message.into(),
        }
    }

    pub fn bad_value(message: impl Into<String>) -> MqlError {
        MqlError::new(2, "BadValue", message)
    }

    pub fn failed_to_parse(message: impl Into<String>) -> MqlError {
        MqlError::new(9, "FailedToParse", message)
    }

    pub fn type_mismatch(message: impl Into<String>) -> MqlError {
        MqlError::new(14, "TypeMismatch", message)
    }

    /// A path an update cannot create or traverse (`{$set: {"a.b": 1}}` on `{a: 5}`).
    pub fn path_not_viable(message: impl Into<String>) -> MqlError {
        MqlError::new(28, "PathNotViable", message)
    }

    pub fn conflicting_update_operators(message: impl Into<String>) -> MqlError {
        MqlError::new(40, "ConflictingUpdateOperators", message)
    }

    pub fn dollar_prefixed_field_name(message: impl Into<String>) -> MqlError {
        MqlError::new(52, "DollarPrefixedFieldName", message)
    }

    /// Two equality conditions of an upsert's filter on one path, or on a path and its prefix.
    pub fn not_single_value_field(message: impl Into<String>) -> MqlError {
        MqlError::new(54, "NotSingleValueField", message)
    }

    pub fn empty_field_name(message: impl Into<String>) -> MqlError {
        MqlError::new(56, "EmptyFieldName", message)
    }

    /// An `_id` condition of a replacement upsert that does not give the whole `_id`.
    pub fn not_exact_value_field(message: impl Into<String>) -> MqlError {
        MqlError::new(63, "NotExactValueField", message)
    }

    pub fn immutable_field(message: impl Into<String>) -> MqlError {
        MqlError::new(66, "ImmutableField", message)
    }

    /// A query feature a context forbids (`$expr` in an upsert's filter).
    pub fn query_feature_not_allowed(message: impl Into<String>) -> MqlError {
        MqlError::new(224, "QueryFeatureNotAllowed", message)
    }

    pub fn invalid_options(message: impl Into<String>) -> MqlError {
        MqlError::new(72, "InvalidOptions", message)
    }

    /// An error MongoDB raises with a code of its own that has no name (a "location" code):
    /// its `codeName` is `Location<code>`, as a server sends it.
    pub fn location(code: i32, message: impl Into<String>) -> MqlError {
        MqlError::new(code, location_name(code), message)
    }

    /// Valid MongoDB that the front does not evaluate. NotImplemented (238) rather than
    /// BadValue: the request is not wrong, this server does not do it, and the message names
    /// what it does. (CommandNotSupported, 115, is about whole commands; drivers retry
    /// neither.)
    pub fn not_implemented(message: impl Into<String>) -> MqlError {
        MqlError::new(238, "NotImplemented", message)
    }
}

/// The `codeName` of a location code. MongoDB sends `Location<code>`; the names are static
/// strings, so the codes this module raises are listed here (an unlisted one reads
/// "Location").
fn location_name(code: i32) -> &'static str {
    macro_rules! names {
        ($($code:literal),* $(,)?) => {
            match code {
                $($code => concat!("Location", $code),)*
                _ => "Location",
            }
        };
    }
    names!(
        15947, 15948, 15952, 15955, 15956, 15957, 15958, 15959, 15969, 15973, 15974, 15975, 15976,
        15998, 16410, 16436, 16554, 17276, 31002, 31119, 31120, 31249, 31250, 31252, 31253, 31254,
        31310, 31324, 31325, 40156, 40157, 40158, 40160, 40234, 40235, 40236, 40237, 40238, 40272,
        40323, 40324, 40352, 51272, 5107200, 5107201, 15972, 16746, 16872, 17312, 17390, 4544702,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_codes_are_named_as_a_server_names_them() {
        let e = MqlError::location(40324, "Unrecognized pipeline stage name: '$foo'");
        assert_eq!(e.code_name, "Location40324");
        assert_eq!(e.code, 40324);
        assert_eq!(MqlError::location(1, "x").code_name, "Location");
        assert_eq!(
            MqlError::not_implemented("x").to_string(),
            "x (NotImplemented 238)"
        );
    }
}
