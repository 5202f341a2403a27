//! The login matrix: riser's initiator and target login machines talking through the wire codec
//! (see `login_harness`) over a matrix of offer combinations: operational keys, discovery, CHAP,
//! admission and the iSER key set.

mod login_harness;

use login_harness::*;
use riser_iscsi::chap::ChapAlgorithm;
use riser_iscsi::keys::{Digest, OperationalConfig, SessionType, Transport};
use riser_iscsi::login::*;

// ---- negotiation without authentication --------------------------------------------------

#[test]
fn c01_defaults() {
    let r = run(initiator_cfg(), target_cfg());
    let (p, _) = r.completed();
    assert_eq!((p.header_digest, p.data_digest), (Digest::None, Digest::None));
    assert_eq!(p.session_type, SessionType::Normal);
    assert_eq!(p.target_name, TARGET);
    assert_eq!(p.initiator_name, INITIATOR);
    assert_eq!(p.target_portal_group_tag, Some(1));
    assert_eq!((p.initiator_recv_data_segment_length, p.target_recv_data_segment_length), (262_144, 262_144));
    assert_eq!((p.max_burst_length, p.first_burst_length, p.initial_r2t, p.immediate_data), (1_048_576, 262_144, false, true));
    // TargetPortalGroupTag is in the first response (Linux iscsid requires it).
    assert!(r.transcript[1].1.iter().any(|(k, v)| k == "TargetPortalGroupTag" && v == "1"));
}

#[test]
fn c02_both_digests_crc32c_preferred() {
    let mut i = initiator_cfg();
    i.operational.header_digest = vec![Digest::Crc32c, Digest::None];
    i.operational.data_digest = vec![Digest::Crc32c, Digest::None];
    let (p, _) = run(i, target_cfg()).completed();
    assert_eq!((p.header_digest, p.data_digest), (Digest::Crc32c, Digest::Crc32c));
}

#[test]
fn c03_digest_offer_target_cannot_do_is_rejected_to_none() {
    let mut i = initiator_cfg();
    i.operational.header_digest = vec![Digest::Crc32c];
    let mut t = target_cfg();
    t.operational.header_digest = vec![Digest::None];
    let r = run(i, t);
    assert_eq!(r.sent(false, "HeaderDigest"), ["Reject"]);
    assert_eq!(r.completed().0.header_digest, Digest::None);
}

#[test]
fn c04_target_requiring_digest_gets_it_from_a_list() {
    let mut t = target_cfg();
    t.operational.data_digest = vec![Digest::Crc32c];
    let (p, _) = run(initiator_cfg(), t).completed();
    assert_eq!((p.header_digest, p.data_digest), (Digest::None, Digest::Crc32c));
}

#[test]
fn c05_target_limits_win() {
    let mut t = target_cfg();
    t.operational = OperationalConfig::default()
        .max_burst_length(65_536)
        .first_burst_length(8192)
        .immediate_data(false)
        .initial_r2t(true)
        .max_recv_data_segment_length(8192);
    let (p, _) = run(initiator_cfg(), t).completed();
    assert_eq!((p.max_burst_length, p.first_burst_length, p.immediate_data, p.initial_r2t), (65_536, 8192, false, true));
    assert_eq!(p.target_recv_data_segment_length, 8192);
    assert_eq!(p.initiator_recv_data_segment_length, 262_144);
}

#[test]
fn c06_erl_minimum_and_time2wait_maximum() {
    let mut i = initiator_cfg();
    i.operational.error_recovery_level = 2;
    i.operational.default_time2wait = 0;
    i.operational.default_time2retain = 3600;
    let mut t = target_cfg();
    t.operational.default_time2wait = 5;
    let (p, _) = run(i, t).completed();
    assert_eq!((p.error_recovery_level, p.default_time2wait, p.default_time2retain), (0, 5, 20));
}

#[test]
fn c07_target_offers_keys_the_initiator_left_at_default() {
    // An initiator that offers nothing operational (like a minimal one); the target must offer
    // what its limits do not allow at the defaults, and the initiator answers.
    let mut i = initiator_cfg();
    i.operational = OperationalConfig::default().max_burst_length(262_144).first_burst_length(65_536).initial_r2t(true);
    let mut t = target_cfg();
    t.operational.immediate_data = false;
    t.operational.max_burst_length = 131_072;
    let r = run(i, t);
    let (p, _) = r.completed();
    assert!(!p.immediate_data);
    assert_eq!(p.max_burst_length, 131_072);
}

#[test]
fn c08_discovery_session() {
    let mut i = initiator_cfg();
    i.target_name = None;
    let r = run(i, target_cfg());
    let (p, _) = r.completed();
    assert_eq!(p.session_type, SessionType::Discovery);
    assert_eq!(p.target_name, "");
    // Normal-session keys are not offered on discovery; no TPGT needed.
    assert!(r.sent(true, "MaxBurstLength").is_empty());
}

#[test]
fn c09_discovery_with_chap() {
    let mut i = initiator_cfg();
    i.target_name = None;
    i.auth = chap("disc", "discoverysecret", &[ChapAlgorithm::Md5], None);
    let mut t = target_cfg();
    t.discovery_chap = Some(creds("disc", "discoverysecret"));
    let r = run(i, t);
    r.completed();
    assert_eq!(r.sent(false, "AuthMethod"), ["CHAP"]);
}

// ---- CHAP ---------------------------------------------------------------------------------

fn chap_ok(alg: ChapAlgorithm) {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[alg], None);
    let r = run(i, chap_target("alicesecret123", None));
    r.completed();
    assert_eq!(r.sent(false, "CHAP_A"), [alg.code().to_string()]);
    // The challenge is at least the digest length, the response exactly the digest length.
    let c = &r.sent(false, "CHAP_C")[0];
    assert!(c.len() - 2 >= 2 * alg.digest_len());
    assert_eq!(r.sent(true, "CHAP_R")[0].len() - 2, 2 * alg.digest_len());
}

#[test]
fn c10_chap_md5() {
    chap_ok(ChapAlgorithm::Md5);
}
#[test]
fn c11_chap_sha1() {
    chap_ok(ChapAlgorithm::Sha1);
}
#[test]
fn c12_chap_sha256() {
    chap_ok(ChapAlgorithm::Sha256);
}
#[test]
fn c13_chap_sha3_256() {
    chap_ok(ChapAlgorithm::Sha3_256);
}

#[test]
fn c14_chap_algorithm_choice_follows_initiator_order() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &ChapAlgorithm::ALL, None);
    let mut t = chap_target("alicesecret123", None);
    t.chap_algorithms = vec![ChapAlgorithm::Md5, ChapAlgorithm::Sha256];
    let r = run(i, t);
    r.completed();
    assert_eq!(r.sent(true, "CHAP_A"), ["8,7,6,5"]);
    assert_eq!(r.sent(false, "CHAP_A"), ["7"]);
}

#[test]
fn c15_mutual_chap_md5() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], Some(creds("target0", "targetsecret12")));
    let r = run(i, chap_target("alicesecret123", Some(creds("target0", "targetsecret12"))));
    r.completed();
    assert_eq!(r.sent(false, "CHAP_N"), ["target0"]);
}

#[test]
fn c16_mutual_chap_sha3() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Sha3_256], Some(creds("target0", "targetsecret12")));
    run(i, chap_target("alicesecret123", Some(creds("target0", "targetsecret12")))).completed();
}

#[test]
fn c17_wrong_secret() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "not-the-secret", &[ChapAlgorithm::Md5], None);
    assert_eq!(run(i, chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c18_wrong_user() {
    let mut i = initiator_cfg();
    i.auth = chap("mallory", "alicesecret123", &[ChapAlgorithm::Md5], None);
    assert_eq!(run(i, chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c19_no_common_chap_algorithm() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    let mut t = chap_target("alicesecret123", None);
    t.chap_algorithms = vec![ChapAlgorithm::Sha256];
    assert_eq!(run(i, t).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c20_target_fails_mutual_chap() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], Some(creds("target0", "expectedsecret")));
    let r = run(i, chap_target("alicesecret123", Some(creds("target0", "othersecret123"))));
    assert_eq!(r.initiator_failed(), LoginFailure::Authentication(AuthFailure::MutualChapFailed));
}

#[test]
fn c21_target_requires_mutual() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    assert_eq!(
        run(i, chap_target("alicesecret123", Some(creds("t", "targetsecret12")))).target_failed(),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

#[test]
fn c22_initiator_asks_mutual_target_has_none() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], Some(creds("t", "targetsecret12")));
    assert_eq!(run(i, chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c23_target_requires_chap_initiator_offers_none() {
    assert_eq!(run(initiator_cfg(), chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c24_initiator_requires_chap_target_has_none() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    assert_eq!(run(i, target_cfg()).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

// ---- admission ----------------------------------------------------------------------------

#[test]
fn c25_target_not_found() {
    let mut i = initiator_cfg();
    i.target_name = Some("iqn.2026-11.io.riser:nope".into());
    assert_eq!(run(i, target_cfg()).target_failed(), LoginStatus::NOT_FOUND);
}

#[test]
fn c26_acl_refusal() {
    let mut t = target_cfg();
    t.targets[0] = t.targets[0].clone().allow("iqn.2026-11.io.riser:someone-else");
    assert_eq!(run(initiator_cfg(), t).target_failed(), LoginStatus::AUTHORIZATION_FAILURE);
}

#[test]
fn c27_acl_admits_listed_initiator() {
    let mut t = target_cfg();
    t.targets[0] = t.targets[0].clone().allow(INITIATOR.to_uppercase());
    run(initiator_cfg(), t).completed();
}

#[test]
fn c27b_acl_entry_credentials_replace_the_nodes() {
    // The node's CHAP is alice's; this initiator has credentials of its own in the ACL, and only
    // those open the door (mutual CHAP answered with the entry's target credentials).
    let mut t = chap_target("alicesecret123", None);
    t.targets[0] = t.targets[0]
        .clone()
        .acl_entry(AclEntry::new(INITIATOR).chap(creds("bob", "bobsecret12345")).mutual_chap(creds("target-b", "targetbsecret1")))
        .allow("iqn.2026-11.io.riser:someone-else");
    let mut i = initiator_cfg();
    i.auth = chap("bob", "bobsecret12345", &[ChapAlgorithm::Sha256], Some(creds("target-b", "targetbsecret1")));
    run(i, t.clone()).completed();
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Sha256], None);
    assert_eq!(run(i, t).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c27c_acl_entry_without_credentials_uses_the_nodes() {
    let mut t = chap_target("alicesecret123", None);
    t.targets[0] =
        t.targets[0].clone().allow(INITIATOR).acl_entry(AclEntry::new("iqn.2026-11.io.riser:x").chap(creds("x", "xsecret1234567")));
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    run(i, t.clone()).completed();
    // Without CHAP the node still requires it.
    assert_eq!(run(initiator_cfg(), t).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c27e_an_open_node_admits_everyone_and_named_initiators_keep_their_credentials() {
    let mut t = target_cfg();
    let mut node = t.targets[0].clone().acl_entry(AclEntry::new(INITIATOR).chap(creds("bob", "bobsecret12345")));
    assert!(!node.open, "naming an initiator closes the node");
    node.open = true;
    t.targets[0] = node;
    // Named: its own credentials are required.
    assert_eq!(run(initiator_cfg(), t.clone()).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
    let mut i = initiator_cfg();
    i.auth = chap("bob", "bobsecret12345", &[ChapAlgorithm::Md5], None);
    run(i, t.clone()).completed();
    // Not named: admitted without authentication (the node has no CHAP of its own).
    let mut i = initiator_cfg();
    i.initiator_name = "iqn.2026-11.io.riser:stranger".into();
    run(i, t).completed();
}

#[test]
fn c27f_a_closed_node_without_entries_admits_nobody() {
    let mut t = target_cfg();
    t.targets[0].open = false;
    assert_eq!(run(initiator_cfg(), t).target_failed(), LoginStatus::AUTHORIZATION_FAILURE);
}

#[test]
fn c27d_a_node_declares_its_own_portal_group_tag() {
    let mut t = target_cfg();
    t.targets[0].portal_group_tag = Some(7);
    let r = run(initiator_cfg(), t);
    assert_eq!(r.completed().0.target_portal_group_tag, Some(7));
    assert!(r.transcript[1].1.iter().any(|(k, v)| k == "TargetPortalGroupTag" && v == "7"));
}

// ---- iSER keys ----------------------------------------------------------------------------

#[test]
fn c28_iser_key_set() {
    let mut i = initiator_cfg();
    i.transport = Transport::Iser;
    i.operational.max_recv_data_segment_length = 512;
    let mut t = target_cfg();
    t.transport = Transport::Iser;
    t.operational.max_recv_data_segment_length = 8192;
    let r = run(i, t);
    let (p, _) = r.completed();
    assert!(p.rdma_extensions);
    assert_eq!((p.initiator_recv_data_segment_length, p.target_recv_data_segment_length), (512, 8192));
    assert_eq!((p.header_digest, p.data_digest), (Digest::None, Digest::None));
    // Digests and MaxRecvDataSegmentLength are not offered on iSER.
    for key in ["HeaderDigest", "DataDigest", "MaxRecvDataSegmentLength", "IFMarker"] {
        assert!(r.sent(true, key).is_empty() && r.sent(false, key).is_empty(), "{key} sent on iSER");
    }
    assert_eq!(r.sent(true, "RDMAExtensions"), ["Yes"]);
    assert_eq!(r.sent(false, "TargetRecvDataSegmentLength"), ["8192"]);
}

#[test]
fn c29_iser_initiator_against_tcp_portal() {
    let mut i = initiator_cfg();
    i.transport = Transport::Iser;
    let r = run(i, target_cfg());
    assert_eq!(r.sent(false, "RDMAExtensions"), ["No"]);
    assert_eq!(r.initiator_failed(), LoginFailure::Protocol(LoginViolation::RdmaExtensionsRefused));
}

#[test]
fn c30_tcp_initiator_against_iser_portal() {
    let mut t = target_cfg();
    t.transport = Transport::Iser;
    assert_eq!(run(initiator_cfg(), t).target_failed(), LoginStatus::MISSING_PARAMETER);
}
