//! Forward paths joined to a destination: a path that is accepted never
//! leaves the destination's scheme, host, port or path prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spoold::spool::StoredRequest;

fuzz_target!(|raw: &str| {
    let raw = format!("/{raw}");
    let Ok(path) = spoold::testing::resolve_path(&raw) else {
        return;
    };
    let request = StoredRequest {
        method: "POST".into(),
        path,
        query: String::new(),
        headers: vec![],
    };
    let destination =
        spoold::testing::Destination::parse("https://h.example.com:8443/base").unwrap();
    if let Ok(url) = destination.target(Some(&request)) {
        assert_eq!(url.scheme(), "https");
        assert_eq!(url.host_str(), Some("h.example.com"));
        assert_eq!(url.port(), Some(8443));
        assert!(
            url.path() == "/base" || url.path().starts_with("/base/"),
            "{url}"
        );
    }
});
