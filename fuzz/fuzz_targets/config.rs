//! A node config (TOML), read and checked as `abhyasa node --config` does before it touches
//! the disk or the network.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = abhyasa_cli::check_config_text(text);
    }
});
