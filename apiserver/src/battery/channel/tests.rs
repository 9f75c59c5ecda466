use super::*;

fn endpoint(address: &str, security: Security) -> BatteryEndpoint {
    BatteryEndpoint {
        address: address.to_owned(),
        security,
        token_file: None,
    }
}

fn tls() -> Security {
    Security::Tls(TlsSettings {
        ca_file: PathBuf::from("ca.crt"),
        client: None,
        server_name: None,
    })
}

#[test]
fn the_address_scheme_must_agree_with_the_security_asked_for() {
    let secured = endpoint("127.0.0.1:50051", tls());
    let (uri, tls_settings) = secured.uri().unwrap();
    assert_eq!(uri.to_string(), "https://127.0.0.1:50051/");
    assert!(tls_settings.is_some());
    let plaintext = endpoint("127.0.0.1:50051", Security::Plaintext);
    let (uri, tls_settings) = plaintext.uri().unwrap();
    assert_eq!(uri.to_string(), "http://127.0.0.1:50051/");
    assert!(tls_settings.is_none());
    assert!(
        endpoint("http://127.0.0.1:1", Security::Plaintext)
            .uri()
            .is_ok()
    );
    assert!(endpoint("https://[::1]:1", tls()).uri().is_ok());
    assert!(matches!(
        endpoint("http://127.0.0.1:1", tls()).uri(),
        Err(ChannelError::PlaintextNotAsked)
    ));
    assert!(matches!(
        endpoint("https://127.0.0.1:1", Security::Plaintext).uri(),
        Err(ChannelError::TlsNotConfigured)
    ));
    for bad in ["127.0.0.1", "unix:///tmp/x:1", "not an address", ""] {
        assert!(
            matches!(
                endpoint(bad, Security::Plaintext).uri(),
                Err(ChannelError::Address(_))
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn the_token_file_is_one_line_and_never_prints() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "s3cret\n").unwrap();
    let credentials = Credentials::load(Some(&path)).unwrap();
    let value = credentials.token.as_ref().unwrap().current();
    assert_eq!(
        value.to_str().unwrap(),
        battery_proto::poolmgr::basic_auth::header_value("s3cret")
    );
    assert!(value.is_sensitive());
    assert!(!format!("{credentials:?}").contains("s3cret"));
    let request = credentials.clone().call(tonic::Request::new(())).unwrap();
    assert!(!format!("{request:?}").contains("czNjcmV0"), "{request:?}");

    for (contents, empty) in [("", true), ("  \n", true), ("two\nlines\n", false)] {
        std::fs::write(&path, contents).unwrap();
        let err = read_token(&path).unwrap_err();
        assert_eq!(
            matches!(err, ChannelError::TokenEmpty { .. }),
            empty,
            "{contents:?}: {err}"
        );
    }
}

#[test]
fn a_changed_token_file_is_read_again_and_a_broken_one_keeps_the_old() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "first").unwrap();
    let credentials = Credentials::load(Some(&path)).unwrap();
    let token = credentials.token.as_ref().unwrap();
    let current = || token.current().to_str().unwrap().to_owned();
    // A later modification time than the first file's, whatever the clock's resolution.
    let rewrite = |contents: &str, seconds: u64| {
        std::fs::write(&path, contents).unwrap();
        let later = std::time::SystemTime::now() + Duration::from_secs(seconds);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(later)
            .unwrap();
    };
    rewrite("second", 10);
    token.reload_if_changed();
    assert_eq!(
        current(),
        battery_proto::poolmgr::basic_auth::header_value("second")
    );
    rewrite("", 20);
    token.reload_if_changed();
    assert_eq!(
        current(),
        battery_proto::poolmgr::basic_auth::header_value("second")
    );
}
