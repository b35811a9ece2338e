//! [`StepName`]: how a step is known in its unit's journal.

use std::fmt;

use crate::observe::KeyLogging;
use crate::unit::digest_of;

/// The name of a step in its unit's journal: a string literal, or a literal with a key part
/// for a step that runs once per item (`("mail", recipient)`).
///
/// A rerun matches each step to the journal by its place and its name, so a name says which
/// effect a recorded result belongs to: a body that calls its steps in another order gets
/// [`StepErrorKind::OrderChanged`](crate::StepErrorKind::OrderChanged) instead of another
/// step's result.
///
/// ```
/// use idempotask::StepName;
/// assert_eq!(StepName::from("charge").to_string(), "charge");
/// assert_eq!(StepName::from(("mail", "ada@example.com")).to_string(), "mail[ada@example.com]");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepName {
    name: &'static str,
    part: Option<String>,
}

impl StepName {
    /// The literal part of the name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The key part, for a step named with one.
    pub fn part(&self) -> Option<&str> {
        self.part.as_deref()
    }
}

impl From<&'static str> for StepName {
    fn from(name: &'static str) -> Self {
        Self { name, part: None }
    }
}

impl<P: fmt::Display> From<(&'static str, P)> for StepName {
    fn from((name, part): (&'static str, P)) -> Self {
        Self {
            name,
            part: Some(part.to_string()),
        }
    }
}

impl fmt::Display for StepName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.part {
            Some(part) => write!(f, "{}[{part}]", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// A step's name as logs, spans and errors show it: with its key part when the task shows keys
/// ([`KeyLogging::Plain`]), else with the part's digest in its place (a part is often as
/// private as a key: a recipient, an account).
pub(crate) struct Shown<'a> {
    name: &'a StepName,
    logging: KeyLogging,
}

impl StepName {
    pub(crate) fn shown(&self, logging: KeyLogging) -> Shown<'_> {
        Shown {
            name: self,
            logging,
        }
    }
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.name.part, self.logging) {
            (Some(part), KeyLogging::Hash) => write!(f, "{}[#{}]", self.name.name, digest_of(part)),
            _ => fmt::Display::fmt(self.name, f),
        }
    }
}
