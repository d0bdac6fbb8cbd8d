//! The tests of `src/os/trusted.rs`, through the library (the library has no test target of its own: see Cargo.toml).
use flashtune::os::trusted::*;
use std::path::Path;

fn tree(dir: &Path) -> TrustedTree {
    TrustedTree::take(vec![dir.to_path_buf()], "the toolchain", "reinstall it")
}

#[test]
fn a_tree_names_a_file_modified_added_removed_or_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("ptxas"), "#!/bin/sh\n").unwrap();
    std::fs::write(bin.join("cicc"), "#!/bin/sh\n").unwrap();
    let trusted = tree(dir.path());
    assert_eq!(trusted.check(), Ok(()));

    // Appended to: same inode, other size and times.
    std::fs::OpenOptions::new()
        .append(true)
        .open(bin.join("ptxas"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"exit 0\n"))
        .unwrap();
    let e = trusted.check().unwrap_err();
    assert_eq!(
        (e.path.clone(), e.change.as_str()),
        (bin.join("ptxas"), "was modified")
    );
    assert!(
        e.to_string()
            .contains(&bin.join("ptxas").display().to_string()),
        "{e}"
    );
    assert!(e.to_string().contains("reinstall it"), "{e}");

    let trusted = tree(dir.path());
    std::fs::write(dir.path().join("cicc.new"), "#!/bin/sh\n").unwrap();
    std::fs::rename(dir.path().join("cicc.new"), bin.join("cicc")).unwrap();
    assert_eq!(trusted.check().unwrap_err().change, "was replaced");

    let trusted = tree(dir.path());
    std::fs::write(bin.join("nvlink"), "").unwrap();
    let e = trusted.check().unwrap_err();
    assert_eq!(
        (e.path, e.change.as_str()),
        (bin.join("nvlink"), "was added")
    );

    let trusted = tree(dir.path());
    std::fs::remove_file(bin.join("cicc")).unwrap();
    assert_eq!(trusted.check().unwrap_err().change, "was removed");
}

#[test]
fn a_file_is_named_when_its_bytes_change_and_not_for_a_touch() {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("flashtune");
    std::fs::write(&exe, b"worker").unwrap();
    let trusted = TrustedFile::take(&exe, "the worker binary", "rebuild it").unwrap();
    assert_eq!(trusted.check(), Ok(()));
    // Same bytes, new times: not tampering.
    std::fs::write(&exe, b"worker").unwrap();
    assert_eq!(trusted.check(), Ok(()));
    std::fs::write(dir.path().join("swap"), b"worker, scaled by 0.7").unwrap();
    std::fs::rename(dir.path().join("swap"), &exe).unwrap();
    let e = trusted.check().unwrap_err();
    assert_eq!(
        (e.path.clone(), e.change.as_str()),
        (exe.clone(), "has other bytes")
    );
    assert!(
        e.to_string().starts_with("the worker binary changed"),
        "{e}"
    );
}
