//! Record bodies that passed their checksum but say anything: decoding
//! returns an error, never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spoold::testing::Record;
use spoold::testing::{decode_attempts, decode_payload};

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let _ = Record::decode(kind, body);
    let _ = decode_payload(body);
    let _ = decode_attempts(body);
});
