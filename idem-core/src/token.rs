//! Fencing tokens.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The fencing value of one claim ([contract §1](crate::contract#words)).
///
/// Each successful claim gets a new token; only the holder of the current token may complete,
/// release or extend. A token has two parts:
///
/// - `seq`, a counter that goes up by one with every claim of the same record, and continues
///   upward when an expired record is replaced. It orders the claims of one record.
/// - `id`, 128 random bits drawn afresh for every claim. It makes the token unique even where
///   `seq` restarts (a record purged and created again), so a paused old holder can never match a
///   new record's token.
///
/// Tokens compare by `seq` first, then by `id`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Token {
    /// The claim counter of the record.
    pub seq: u64,
    /// A random identifier, unique per claim.
    pub id: u128,
}

impl Token {
    /// A token with the given counter and a fresh random id.
    pub fn new(seq: u64) -> Self {
        Self::with_id(seq, rand::random())
    }

    /// A token with the given counter and id (for stores that read one back).
    pub const fn with_id(seq: u64, id: u128) -> Self {
        Self { seq, id }
    }

    /// The id as 32 lower-case hex digits (how stores keep it as text).
    pub fn id_hex(&self) -> String {
        format!("{:032x}", self.id)
    }

    /// Parses an id written by [`Token::id_hex`].
    pub fn parse_id_hex(hex: &str) -> Option<u128> {
        if hex.len() != 32 {
            return None;
        }
        u128::from_str_radix(hex, 16).ok()
    }

    /// A short prefix for logs: `seq` and the first 8 hex digits of the id.
    pub fn short(&self) -> String {
        format!("{}-{:08x}", self.seq, (self.id >> 96) as u32)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}-{:032x})", self.seq, self.id)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{:032x}", self.seq, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_tokens_differ_and_order_by_seq() {
        let a = Token::new(1);
        let b = Token::new(1);
        assert_ne!(a, b);
        assert!(Token::new(2) > a);
        assert_eq!(Token::parse_id_hex(&a.id_hex()), Some(a.id));
        assert_eq!(Token::parse_id_hex("zz"), None);
    }

    #[test]
    fn a_short_token_is_its_seq_and_the_first_8_hex_digits_of_its_id() {
        let token = Token {
            seq: 7,
            id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        };
        assert_eq!(token.short(), "7-01234567");
        assert!(token.id_hex().starts_with("01234567"));
    }

    /// In full (a record shown by `idem keys show`, a fenced write in a log), a token is its
    /// `seq` and all 32 hex digits of its id: two claims are told apart by the id.
    #[test]
    fn a_token_is_written_whole_as_its_seq_and_id() {
        let token = Token {
            seq: 7,
            id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        };
        assert_eq!(token.to_string(), "7-0123456789abcdef0011223344556677");
        assert_eq!(
            format!("{token:?}"),
            "Token(7-0123456789abcdef0011223344556677)"
        );
    }
}
