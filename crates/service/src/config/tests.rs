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
        iser_threads = 3
        busy_poll_us = 50
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
    assert_eq!(c.iser_threads, 3);
    assert_eq!(limits("[limits]\niser_threads = 0\n").unwrap().target.iser_threads, 0, "0: the service's runtime");
    assert_eq!(c.busy_poll, Some(Duration::from_micros(50)));
    assert_eq!(t.rnic.as_ref().and_then(|r| r.busy_poll), Some(Duration::from_micros(50)), "the software RNIC polls too");
    assert_eq!(limits("[limits]\nbusy_poll_us = 0\n").unwrap().target.busy_poll, None, "0: off");
    assert_eq!(t.rnic.map(|r| r.max_handshakes), Some(4));
    let only_polling = limits("[limits]\nbusy_poll_us = 20\n").unwrap().rnic.expect("an RNIC configuration");
    assert_eq!((only_polling.busy_poll, only_polling.max_handshakes), (Some(Duration::from_micros(20)), 64));
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
        assert_eq!(c.busy_poll, d.busy_poll);
        // Unlike the library's (0: the caller's runtime), the service's: one thread per CPU.
        assert_eq!(c.iser_threads, default_iser_threads());
        assert!(c.iser_threads >= 1);
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
        ("busy_poll_us = -1", "limits.busy_poll_us"),
        ("busy_poll_us = 1000001", "limits.busy_poll_us"),
        ("busy_poll_us = 0.5", "limits.busy_poll_us"),
        ("iser_threads = -1", "limits.iser_threads"),
        ("iser_threads = 1025", "limits.iser_threads"),
        ("iser_threads = \"all\"", "limits.iser_threads"),
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

fn resolve(text: &str) -> Result<Resolved, String> {
    parse(text, "target.toml")?.resolve(Path::new("/etc/riser"))
}

#[test]
fn the_example_configuration_resolves() {
    let r = resolve(include_str!("../../../../dist/target.example.toml")).unwrap();
    assert_eq!(r.stores.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["disk0", "scratch"]);
    let t = &r.targets[0];
    assert_eq!(t.luns, BTreeMap::from([(0, "disk0".to_string()), (1, "scratch".to_string())]));
    assert!(!t.open, "a target with ACL entries admits only them");
    assert_eq!(t.acl[1].luns, Some(BTreeMap::from([(0, 1)])));
    assert_eq!(r.settings.metrics, Some("127.0.0.1:9469".parse().unwrap()));
    assert_eq!(r.settings.drain_timeout, Duration::from_secs(30));
    assert_eq!(r.settings.target.logout_timeout, Duration::from_secs(10));
}

#[test]
fn the_command_line_form_is_one_target_of_numbered_stores() {
    let r =
        resolve("lun = [\"ram:64MiB\", \"file:/var/tmp/a.img:1GiB\"]\nacl = [\"iqn.2026-11.io.riser:i\"]\niser_portal = [\"127.0.0.1\"]\n")
            .unwrap();
    assert_eq!(
        r.stores.iter().map(|s| (s.name.as_str(), s.backing.as_str())).collect::<Vec<_>>(),
        [("lun0", "ram:64MiB"), ("lun1", "file:/var/tmp/a.img:1GiB")]
    );
    let t = &r.targets[0];
    assert_eq!(t.name, DEFAULT_TARGET_NAME);
    assert!(!t.open);
    assert_eq!(t.luns.len(), 2);
    let portals: Vec<_> = t.portal_groups[0].portals.iter().map(|p| (p.portal.address.to_string(), p.portal.transport)).collect();
    assert_eq!(
        portals,
        [("127.0.0.1:3260".to_string(), Transport::Tcp), ("127.0.0.1:3262".to_string(), Transport::Iser)],
        "iSER on the software RNIC: 3262"
    );
    // Nothing at all: one target, one 1 GiB RAM LUN, open, on 127.0.0.1:3260.
    let d = resolve("").unwrap();
    assert_eq!((d.stores[0].backing.as_str(), d.targets[0].open), ("ram:1GiB", true));
}

#[test]
fn the_single_target_keys_and_target_tables_exclude_each_other() {
    let e =
        resolve("lun = [\"ram:1MiB\"]\n[[store]]\nname = \"a\"\nbacking = \"ram:1MiB\"\n[[target]]\nname = \"iqn.2026-11.io.riser:t\"\n")
            .unwrap_err();
    assert!(e.contains("lun") && e.contains("[[target]]"), "{e}");
}

#[test]
fn references_and_names_are_checked() {
    let e = resolve("[[target]]\nname = \"iqn.2026-11.io.riser:t\"\n[[target.lun]]\nlun = 0\nstore = \"nope\"\n").unwrap_err();
    assert!(e.contains("nope"), "{e}");
    let e = resolve("[[store]]\nname = \"a\"\nbacking = \"ram:1MiB\"\n[[store]]\nname = \"a\"\nbacking = \"ram:1MiB\"\n").unwrap_err();
    assert!(e.contains("twice"), "{e}");
    let e = resolve("[[target]]\nname = \"iqn.2026-11.io.riser:t\"\n[[target.portal_group]]\ntag = 0\n").unwrap_err();
    assert!(e.contains("tag 0"), "{e}");
    let e = resolve(
        "[[target]]\nname = \"iqn.2026-11.io.riser:t\"\n[[target.acl]]\ninitiator = \"iqn.x:y\"\nmutual_chap = \"a:bbbbbbbbbbbbbb\"\n",
    )
    .unwrap_err();
    assert!(e.contains("mutual CHAP needs CHAP"), "{e}");
    let e = resolve("[[target]]\nname = \"iqn.2026-11.io.riser:t\"\n[[target.portal_group]]\ntag = 2\nportals = [{ address = \"127.0.0.1:3260\", transport = \"fc\" }]\n").unwrap_err();
    assert!(e.contains("fc"), "{e}");
}

#[test]
fn a_saved_configuration_reads_back_as_it_was() {
    let text = r#"
        portal = ["127.0.0.1:3260"]
        [[store]]
        name = "a"
        backing = "file:/var/tmp/a.img:1GiB"
        uuid = "2b3c4d5e-6f70-4812-9a3b-4c5d6e7f8091"
        block_size = 4096
        options = { thin = false }
        [[target]]
        name = "iqn.2026-11.io.riser:t"
        alias = "t"
        chap = { user = "target-user", secret = "target-secret-1" }
        [[target.portal_group]]
        tag = 3
        relative_port = 7
        port_group = 9
        portals = ["127.0.0.1:3260", { address = "127.0.0.1:3262", transport = "iser" }]
        [[target.lun]]
        lun = 4
        store = "a"
        [[target.acl]]
        initiator = "iqn.2026-11.io.riser:i"
        chap = "iuser:isecret-12345"
        luns = { "0" = 4 }
        [[target.acl]]
        initiator = "iqn.2026-11.io.riser:j"
        luns = [4]
    "#;
    let first = resolve(text).unwrap();
    let mut saved = ConfigFile { portal: vec!["127.0.0.1:3260".into()], ..ConfigFile::default() };
    saved.stores = first.stores.iter().map(StoreSpec::to_table).collect();
    saved.targets = first.targets.iter().map(|t| t.to_table(cli::RdmaProvider::Soft)).collect();
    let written = toml::to_string_pretty(&saved).unwrap();
    let again = resolve(&written).unwrap();
    assert_eq!(again.stores, first.stores);
    assert_eq!(again.targets, first.targets);
    assert!(saved.holds_a_secret(), "inline secrets are saved inline (the file is written mode 600)");
    // The credentials came through whole.
    assert_eq!(again.targets[0].acl[0].chap.as_ref().unwrap().creds, ChapCredentials::new("iuser", b"isecret-12345".to_vec()).unwrap());
    assert_eq!(again.targets[0].chap.as_ref().unwrap().creds.user, "target-user");
}

#[test]
fn the_command_line_overrides_the_file() {
    let file =
        parse("portal = [\"10.0.0.1:3260\"]\nlun = [\"ram:1MiB\"]\nmetrics = \"127.0.0.1:1\"\n[limits]\nqueue_depth = 8\n", "f").unwrap();
    let cli = ConfigFile { lun: vec!["ram:2MiB".into()], metrics: Some("127.0.0.1:2".into()), ..ConfigFile::default() };
    let r = file.overlay(cli).resolve(Path::new("")).unwrap();
    assert_eq!(r.stores[0].backing, "ram:2MiB");
    assert_eq!(r.settings.metrics, Some("127.0.0.1:2".parse().unwrap()));
    assert_eq!(r.settings.default_portals[0].portal.address, "10.0.0.1:3260".parse().unwrap(), "not given on the command line: the file's");
    assert_eq!(r.settings.target.queue_depth, 8);
}

#[test]
fn no_secret_in_debug_output() {
    let r = resolve("chap = \"alice:very-secret-word\"\n").unwrap();
    for shown in [format!("{r:?}"), format!("{:?}", parse("chap = \"alice:very-secret-word\"\n", "f").unwrap())] {
        assert!(!shown.contains("very-secret-word"), "{shown}");
    }
}

/// Gateway A's file of a pair exporting store `shared` as target `t` (B: port group 2, relative
/// port 2), with `extra` appended to its LUN table.
fn gateway_a(extra: &str) -> String {
    format!(
        r#"
        [[store]]
        name = "shared"
        backing = "ram:1MiB"
        uuid = "6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab"
        [[target]]
        name = "iqn.2026-11.io.riser:t"
        [[target.portal_group]]
        tag = 1
        relative_port = 1
        port_group = 1
        portals = ["10.0.0.1:3260"]
        [[target.portal_group]]
        tag = 3
        relative_port = 3
        port_group = 1
        portals = ["10.0.1.1:3260"]
        [[target.remote_port_group]]
        port_group = 2
        relative_ports = [2, 4]
        [[target.lun]]
        lun = 0
        store = "shared"
        {extra}
        "#
    )
}

fn model(r: &Resolved, store: &str) -> Vec<(u16, Vec<u16>, AccessState)> {
    port_groups_of(&r.targets, store).into_iter().map(|g| (g.id, g.relative_ports, g.state)).collect()
}

#[test]
fn remote_port_groups_and_the_optimized_group_make_the_alua_model() {
    use AccessState::{ActiveNonOptimized as Ano, ActiveOptimized as Ao};
    // Default: the target's first portal group's port group is optimized.
    let r = resolve(&gateway_a("")).unwrap();
    let t = &r.targets[0];
    assert_eq!(t.remote_port_groups, [RemotePortGroupSpec { port_group: 2, relative_ports: vec![2, 4] }]);
    assert!(t.optimized.is_empty());
    assert_eq!(model(&r, "shared"), [(1, vec![1, 3], Ao), (2, vec![2, 4], Ano)]);
    // The LUN names the remote group.
    let r = resolve(&gateway_a("optimized_port_group = 2")).unwrap();
    assert_eq!(r.targets[0].optimized, BTreeMap::from([(0, 2)]));
    assert_eq!(model(&r, "shared"), [(1, vec![1, 3], Ano), (2, vec![2, 4], Ao)]);
    // Nothing configured: one group, optimized; a store no target exports has no model.
    let r = resolve("lun = [\"ram:1MiB\"]\n").unwrap();
    assert_eq!(model(&r, "lun0"), [(1, vec![1], Ao)]);
    assert!(model(&r, "nope").is_empty());
}

#[test]
fn alua_keys_are_checked() {
    let bad = |extra: &str, remote: &str| {
        let text = gateway_a(extra).replace("relative_ports = [2, 4]", remote);
        resolve(&text).unwrap_err()
    };
    let e = bad("optimized_port_group = 7", "relative_ports = [2, 4]");
    assert!(e.contains("optimized_port_group 7"), "{e}");
    let e = bad("", "relative_ports = [2, 3]");
    assert!(e.contains("relative port 3"), "a port of the target's own: {e}");
    let e = bad("", "relative_ports = [2, 2]");
    assert!(e.contains("relative port 2"), "{e}");
    let e = bad("", "relative_ports = [0]");
    assert!(e.contains("relative port 0"), "{e}");
    let e = bad("", "relative_ports = []");
    assert!(e.contains("1 to 255"), "{e}");
    let e = resolve(&gateway_a("").replace("port_group = 2\n", "port_group = 1\n")).unwrap_err();
    assert!(e.contains("remote_port_group 1"), "the target's own group: {e}");
    let e = resolve(&gateway_a("").replace("[[target.remote_port_group]]", "[[target.remote_port_group]]\nkey = 1")).unwrap_err();
    assert!(e.contains("key"), "{e}");
    let e = resolve(&gateway_a("").replace(
        "tag = 3\n        relative_port = 3\n        port_group = 1",
        "tag = 3\n        relative_port = 1\n        port_group = 5",
    ))
    .unwrap_err();
    assert!(e.contains("relative port 1 in two ALUA port groups"), "{e}");
    // One store exported twice with two optimized groups.
    let two = format!("{}\n[[target.lun]]\nlun = 1\nstore = \"shared\"\noptimized_port_group = 1\n", gateway_a("optimized_port_group = 2"));
    let e = resolve(&two).unwrap_err();
    assert!(e.contains("store \"shared\"") && e.contains("port group 2") && e.contains("port group 1"), "{e}");
}

#[test]
fn alua_keys_are_saved_and_read_back() {
    let first = resolve(&gateway_a("optimized_port_group = 2")).unwrap();
    let saved = ConfigFile {
        stores: first.stores.iter().map(StoreSpec::to_table).collect(),
        targets: first.targets.iter().map(|t| t.to_table(cli::RdmaProvider::Soft)).collect(),
        ..ConfigFile::default()
    };
    let written = toml::to_string_pretty(&saved).unwrap();
    assert!(written.contains("[[target.remote_port_group]]") && written.contains("optimized_port_group = 2"), "{written}");
    assert_eq!(resolve(&written).unwrap().targets, first.targets);
}

#[test]
fn the_example_two_gateway_configuration_resolves() {
    // The commented example of gateway A's file in dist/target.example.toml, uncommented.
    let example = include_str!("../../../../dist/target.example.toml");
    let block: String = example
        .lines()
        .skip_while(|l| !l.starts_with("# --- gateway A"))
        .skip(1)
        .take_while(|l| !l.starts_with("# --- end"))
        .filter_map(|l| l.strip_prefix("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(block.contains("remote_port_group"), "{block}");
    let r = resolve(&block).unwrap();
    use AccessState::{ActiveNonOptimized as Ano, ActiveOptimized as Ao};
    assert_eq!(model(&r, "shared"), [(1, vec![1], Ao), (2, vec![2], Ano)]);
}

#[test]
fn iser_portals_on_the_software_rnic_receive_large_segments_unless_told_otherwise() {
    let settings = |text: &str| parse(text, "target.toml").unwrap().resolve(Path::new("")).unwrap().settings;
    let s = settings("lun = [\"ram:1MiB\"]\n");
    assert_eq!(s.iser_soft.recv_dsl, SOFT_RNIC_RECV_DSL, "software RNIC: writes up to 256 KiB travel as immediate data");
    assert_eq!(s.iser.recv_dsl, riser_iser::IserConfig::default().recv_dsl, "rdma-core: 8 KiB, as LIO");
    let s = settings("lun = [\"ram:1MiB\"]\niser_param = [\"recv_dsl=16384\", \"signal_every=4\"]\n");
    assert_eq!((s.iser_soft.recv_dsl, s.iser.recv_dsl), (16 << 10, 16 << 10), "iser_param sets both");
    assert_eq!((s.iser_soft.signal_every, s.iser.signal_every), (4, 4));
}
