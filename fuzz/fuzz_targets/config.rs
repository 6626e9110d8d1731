//! Any text as a config: parsed or refused with a message, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Err(e) = spoold::config::Config::parse(text) {
        assert!(!e.to_string().is_empty());
    }
});
