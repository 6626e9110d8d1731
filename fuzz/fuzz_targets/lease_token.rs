//! Lease tokens and message ids from the URL: anything a client sends is
//! decoded or refused; a forged token never decodes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spoold::testing::Tokens;

fuzz_target!(|text: &str| {
    let tokens = Tokens::new([7; 32], 0x5eed);
    let _ = tokens.decode(text);
    let _ = tokens.parse_id(text);
});
