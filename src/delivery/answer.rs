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
    /// The destination refused the connection: nothing of the request
    /// was sent.
    pub refused: bool,
}

impl From<String> for SendError {
    fn from(text: String) -> SendError {
        SendError {
            class: AttemptClass::Error,
            text,
            refused: false,
        }
    }
}

impl SendError {
    /// A connect that failed with `e`.
    pub(super) fn connect(e: &(dyn std::error::Error + 'static)) -> SendError {
        SendError {
            class: AttemptClass::Connect,
            text: format!("connect error: {}", with_sources(e)),
            refused: refused(e),
        }
    }
}

/// Whether `e`, or an error under it, is a refused connection.
pub(super) fn refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// An error and every error under it, as one line (`dns error: … resolves
/// only to …`): what an attempt records.
pub(super) fn with_sources(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
