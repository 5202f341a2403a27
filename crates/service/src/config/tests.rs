//! Tests of the configuration file.

use super::*;

/// The limits a config file's text sets.
fn limits(text: &str) -> Result<Tuning, String> {
    parse(text, "target.toml")?.limits.resolve()
}

fn error(text: &str) -> String {
    match limits(text) {
        Ok(_) => panic!("accepted: {text}"),
        Err(e) => e,
    }
}

#[test]
fn limits_table_sets_the_target_config() {
    let t = limits(
        r#"
        lun = ["ram:1MiB"]
        [limits]
        max_connections = 8
        queue_depth = 32
        max_immediate_commands = 0
        max_session_bytes = "64MiB"
        max_target_bytes = "1GiB"
        login_timeout = 5
        data_timeout = 2.5
        send_timeout = 60
        nop_interval = 3
        nop_timeout = 7
        iser_unsolicited_data = true
        max_mpa_handshakes = 4
        "#,
    )
    .unwrap();
    let c = &t.target;
    assert_eq!(c.max_connections, 8);
    assert_eq!(c.queue_depth, 32);
    assert_eq!(c.max_immediate_commands, 0);
    assert_eq!(c.max_session_bytes, 64 << 20);
    assert_eq!(c.max_target_bytes, 1 << 30);
    assert_eq!(c.login.login_timeout, Duration::from_secs(5));
    assert_eq!(c.data_timeout, Duration::from_millis(2500));
    assert_eq!(c.send_timeout, Duration::from_secs(60));
    assert_eq!(c.nop_interval, Some(Duration::from_secs(3)));
    assert_eq!(c.nop_timeout, Duration::from_secs(7));
    assert!(c.iser_unsolicited_data);
    assert_eq!(t.rnic.map(|r| r.max_handshakes), Some(4));
}

#[test]
fn absent_keys_keep_the_defaults() {
    let d = TargetConfig::default();
    for text in ["", "[limits]\n"] {
        let t = limits(text).unwrap();
        let c = &t.target;
        assert_eq!(c.max_connections, d.max_connections);
        assert_eq!(c.queue_depth, d.queue_depth);
        assert_eq!(c.max_immediate_commands, d.max_immediate_commands);
        assert_eq!(c.max_session_bytes, d.max_session_bytes);
        assert_eq!(c.login.login_timeout, d.login.login_timeout);
        assert_eq!(c.data_timeout, d.data_timeout);
        assert_eq!(c.send_timeout, d.send_timeout);
        assert_eq!(c.nop_interval, d.nop_interval);
        assert_eq!(c.nop_timeout, d.nop_timeout);
        assert_eq!(c.iser_unsolicited_data, d.iser_unsolicited_data);
        assert!(t.rnic.is_none());
    }
}

#[test]
fn sizes_as_bytes_and_pings_off() {
    let t = limits("[limits]\nmax_session_bytes = 1048576\nnop_interval = 0\n").unwrap();
    assert_eq!(t.target.max_session_bytes, 1 << 20);
    assert_eq!(t.target.nop_interval, None);
    assert_eq!(limits("[limits]\nnop_interval = \"off\"\n").unwrap().target.nop_interval, None);
    assert_eq!(limits("[limits]\nnop_interval = 0.0\n").unwrap().target.nop_interval, None);
    let t = limits("[limits]\nnop_interval = 0.25\nmax_session_bytes = \"64KiB\"\n").unwrap();
    assert_eq!(t.target.nop_interval, Some(Duration::from_millis(250)));
    assert_eq!(t.target.max_session_bytes, 64 << 10);
}

#[test]
fn bad_values_name_their_key() {
    for (line, key) in [
        ("queue_depth = 0", "limits.queue_depth = 0"),
        ("queue_depth = 65537", "limits.queue_depth"),
        ("queue_depth = -1", "limits.queue_depth"),
        ("queue_depth = \"many\"", "limits.queue_depth"),
        ("max_connections = 0", "limits.max_connections = 0"),
        ("max_immediate_commands = 1.5", "limits.max_immediate_commands"),
        ("max_session_bytes = 0", "limits.max_session_bytes = 0"),
        ("max_session_bytes = \"32KiB\"", "limits.max_session_bytes"),
        ("max_target_bytes = \"1KiB\"", "limits.max_target_bytes"),
        ("max_session_bytes = \"1XB\"", "limits.max_session_bytes"),
        ("login_timeout = 0", "limits.login_timeout = 0"),
        ("data_timeout = -1", "limits.data_timeout"),
        ("send_timeout = \"30s\"", "limits.send_timeout"),
        ("send_timeout = 1e9", "limits.send_timeout"),
        ("send_timeout = nan", "limits.send_timeout"),
        ("nop_interval = \"never\"", "limits.nop_interval"),
        ("nop_timeout = 0", "limits.nop_timeout = 0"),
        ("iser_unsolicited_data = 1", "limits.iser_unsolicited_data"),
        ("max_mpa_handshakes = 0", "limits.max_mpa_handshakes = 0"),
        ("max_mpa_handshakes = 1025", "limits.max_mpa_handshakes"),
    ] {
        let e = error(&format!("[limits]\n{line}\n"));
        assert!(e.contains(key), "{line}: {e}");
    }
}

#[test]
fn params_from_the_config_file_set_the_offered_keys() {
    let file = parse("param = [\"MaxRecvDataSegmentLength=512KiB\", \"InitialR2T=Yes\"]\n", "target.toml").unwrap();
    let o = file.resolve(Path::new("")).unwrap().settings.target.login.operational;
    assert_eq!(o.max_recv_data_segment_length, 512 << 10);
    assert!(o.initial_r2t);
    let mut bad = file.clone();
    bad.param.push("MaxBurstLength=1".into());
    let e = bad.resolve(Path::new("")).unwrap_err();
    assert!(e.contains("MaxBurstLength"), "{e}");
}

#[test]
fn unknown_keys_are_named() {
    let e = error("portal = [\"127.0.0.1:3260\"]\n[limits]\nqueue_dept = 4\n");
    assert!(e.contains("queue_dept") && e.contains("target.toml, line 3"), "{e}");
    let e = error("[limit]\nqueue_depth = 4\n");
    assert!(e.contains("limit"), "{e}");
}
