//! The tests of `src/os/seal.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::os::seal::*;

fn key() -> SealKey {
    SealKey::from_bytes([7; 32])
}

fn sealed(lines: &[&str]) -> Vec<String> {
    let mut c = Chain::start(&key(), "run-1");
    lines.iter().map(|l| c.seal(l.as_bytes())).collect()
}

fn check(lines: &[&str], seals: &[String]) -> std::result::Result<ChainHolds, ChainBreak> {
    let lines: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    let seals: Vec<&str> = seals.iter().map(String::as_str).collect();
    check_chain(&key(), "run-1", &lines, &seals)
}

const LOG: &[&str] = &["header", "timed 71.1", "timed 80.0", "finished"];

#[test]
fn a_whole_chain_holds() {
    let seals = sealed(LOG);
    assert_eq!(
        check(LOG, &seals),
        Ok(ChainHolds {
            sealed: 4,
            unsealed_tail: 0
        })
    );
}

#[test]
fn an_edited_line_is_named() {
    let seals = sealed(LOG);
    let edited = ["header", "timed 10.0", "timed 80.0", "finished"];
    let e = check(&edited, &seals).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.what.contains("does not match its seal"), "{}", e.what);
}

#[test]
fn an_inserted_line_is_named() {
    let seals = sealed(LOG);
    let inserted = ["header", "forged", "timed 71.1", "timed 80.0", "finished"];
    let e = check(&inserted, &seals).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.what.contains("inserted"), "{}", e.what);
}

#[test]
fn a_removed_line_is_named() {
    let seals = sealed(LOG);
    let removed = ["header", "timed 80.0", "finished"];
    let e = check(&removed, &seals).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.what.contains("removed"), "{}", e.what);
}

#[test]
fn a_log_cut_short_of_its_seals_is_named() {
    let seals = sealed(LOG);
    let e = check(&LOG[..2], &seals).unwrap_err();
    assert_eq!(e.line, 3);
    assert!(e.what.contains("removed from its end"), "{}", e.what);
}

/// A crash between writing lines and sealing them leaves lines without seals at the end (one,
/// whole or torn, or a batch of several): the chain holds up to them, and readers drop them as
/// they drop a torn line. Lines someone appended read the same way, and are dropped the same.
#[test]
fn an_unsealed_tail_is_a_crash_not_a_break() {
    let seals = sealed(&LOG[..3]);
    assert_eq!(
        check(LOG, &seals),
        Ok(ChainHolds {
            sealed: 3,
            unsealed_tail: 1
        })
    );
    assert_eq!(
        check(LOG, &seals[..1]),
        Ok(ChainHolds {
            sealed: 1,
            unsealed_tail: 3
        })
    );
    let torn = ["header", "timed 71.1", "timed 80.0", "fini"];
    assert_eq!(check(&torn, &seals).unwrap().sealed, 3);
}

#[test]
fn a_log_forged_whole_with_another_key_or_run_id_is_refused() {
    let mut other = Chain::start(&SealKey::from_bytes([8; 32]), "run-1");
    let forged: Vec<String> = LOG.iter().map(|l| other.seal(l.as_bytes())).collect();
    assert_eq!(check(LOG, &forged).unwrap_err().line, 1);
    let mut moved = Chain::start(&key(), "run-2");
    let copied: Vec<String> = LOG.iter().map(|l| moved.seal(l.as_bytes())).collect();
    assert_eq!(check(LOG, &copied).unwrap_err().line, 1);
}

#[test]
fn a_row_seal_holds_only_for_its_fields() {
    let k = key();
    let seal = k.row_seal(&["run-1", "12", "71.1"]);
    assert!(k.row_seal_holds(&["run-1", "12", "71.1"], &seal));
    assert!(!k.row_seal_holds(&["run-1", "12", "10.0"], &seal));
    assert!(!k.row_seal_holds(&["run-1", "1", "271.1"], &seal));
    assert!(!SealKey::from_bytes([8; 32]).row_seal_holds(&["run-1", "12", "71.1"], &seal));
}

#[test]
fn the_key_is_made_once_private_and_then_kept() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("state/flashtune");
    let a = SealKey::load_or_create_in(&at).unwrap();
    let b = SealKey::load_or_create_in(&at).unwrap();
    assert_eq!(a.row_seal(&["same key"]), b.row_seal(&["same key"]));
    let mode = std::fs::metadata(key_path(&at))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    std::fs::write(key_path(&at), b"short").unwrap();
    let e = SealKey::load_or_create_in(&at).unwrap_err().to_string();
    assert!(e.contains("not a flashtune seal key"), "{e}");
}
