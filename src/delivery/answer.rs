//! What a delivery attempt got back: an answer, or why there was none.

use crate::metrics::AttemptClass;

/// How much of a response body an attempt keeps.
pub(super) const RESPONSE_KEPT_BYTES: usize = 1024;

/// What came back from a destination that answered.
pub(crate) struct Answer {
    pub status: u16,
    pub retry_after: Option<String>,
    pub body: String,
}

/// Why an attempt got no answer.
pub(crate) struct SendError {
    pub class: AttemptClass,
    pub text: String,
}

impl From<String> for SendError {
    fn from(text: String) -> SendError {
        SendError {
            class: AttemptClass::Error,
            text,
        }
    }
}
