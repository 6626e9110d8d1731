//! Any text as a config: parsed or refused with a message, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Err(message) = spoold::config::Config::parse(text) {
        assert!(!message.is_empty());
    }
});
