//! How `idem` ends: its exit codes, and the failure that carries one.

use std::fmt;
use std::process::ExitCode;

use idem_core::StoreError;
use idemkit::OpenError;

/// The exit codes, as `idem --help` and the README list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Success = 0,
    /// 1: anything not below (an unexpected error).
    Failure = 1,
    /// 2: the command line or an input file is wrong (also a store URL that cannot be used).
    Usage = 2,
    /// 3: the store cannot be reached, failed, or is not set up (schema missing: `idem migrate`).
    StoreUnavailable = 3,
    /// 4: no such record.
    NotFound = 4,
    /// 5: refused: the record is completed, its holder's lease still runs (see `--force`), or it
    /// changed meanwhile.
    Refused = 5,
    /// 6: the conformance suite (or the demo's exactly-once check) failed.
    SuiteFailed = 6,
}

/// The exit codes, for `--help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  an unexpected error
  2  usage: a bad argument, store URL or input file
  3  the store is unavailable, failed, or has no schema (run `idem migrate`)
  4  not found: no such record
  5  refused: the record is completed, its holder's lease runs (see --force), or it changed meanwhile
  6  the conformance suite failed (or the demo saw a double effect)";

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Why a command failed: a message for people and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub exit: Exit,
    /// One line (or a few) for stderr.
    pub message: String,
}

impl Failure {
    /// A failure with `exit` and `message`.
    pub fn new(exit: Exit, message: impl fmt::Display) -> Self {
        Self {
            exit,
            message: message.to_string(),
        }
    }

    /// [`Exit::Usage`].
    pub fn usage(message: impl fmt::Display) -> Self {
        Self::new(Exit::Usage, message)
    }

    /// [`Exit::StoreUnavailable`].
    pub fn store(message: impl fmt::Display) -> Self {
        Self::new(Exit::StoreUnavailable, message)
    }

    /// [`Exit::NotFound`].
    pub fn not_found(message: impl fmt::Display) -> Self {
        Self::new(Exit::NotFound, message)
    }

    /// [`Exit::Refused`].
    pub fn refused(message: impl fmt::Display) -> Self {
        Self::new(Exit::Refused, message)
    }

    /// [`Exit::SuiteFailed`].
    pub fn suite_failed(message: impl fmt::Display) -> Self {
        Self::new(Exit::SuiteFailed, message)
    }

    /// [`Exit::Failure`].
    pub fn other(message: impl fmt::Display) -> Self {
        Self::new(Exit::Failure, message)
    }

    /// The same failure with `context: ` before its message.
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl From<OpenError> for Failure {
    fn from(e: OpenError) -> Self {
        if e.is_bad_url() {
            Self::usage(e)
        } else {
            Self::store(e)
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::OutcomeTooLarge(_) => Self::usage(e),
            _ => Self::store(e),
        }
    }
}
