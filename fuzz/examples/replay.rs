//! Runs inputs through a fuzz target's checker outside libFuzzer, on stable, printing what the
//! checker does (the decoded operations, every input and output of the broker): the way to
//! read a crash and turn it into a regression test.
//!
//! ```sh
//! cargo run --release --manifest-path fuzz/Cargo.toml --example replay -- \
//!     broker_sequence fuzz/artifacts/broker_sequence/crash-...
//! # a whole corpus, quietly: every input must pass
//! cargo run --release --manifest-path fuzz/Cargo.toml --example replay -- \
//!     --quiet codec_v5 fuzz/seeds/codec_v5
//! ```

use std::panic;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use meridian_core::codec::ProtocolVersion;

fn checker(target: &str) -> Option<fn(&[u8])> {
    Some(match target {
        "codec_v311" => |d| meridian_fuzz::codec::check(d, ProtocolVersion::V311),
        "codec_v5" => |d| meridian_fuzz::codec::check(d, ProtocolVersion::V5),
        "broker_sequence" => meridian_fuzz::broker::check,
        "topic_match" => meridian_fuzz::topic::check,
        "link_frame" => meridian_fuzz::link::check,
        "route_merge" => meridian_fuzz::routes::check,
        _ => return None,
    })
}

fn inputs(path: &Path) -> Vec<PathBuf> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .expect("read directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && !p.ends_with(".keep"))
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let quiet = args.first().is_some_and(|a| a == "--quiet");
    if quiet {
        args.remove(0);
    }
    let Some(check) = args.first().and_then(|t| checker(t)) else {
        eprintln!(
            "usage: replay [--quiet] TARGET PATH... (targets: codec_v311 codec_v5 broker_sequence \
             topic_match link_frame route_merge)"
        );
        return ExitCode::from(2);
    };
    meridian_fuzz::set_tracing(!quiet);
    let (mut passed, mut failed) = (0, 0);
    for path in args[1..].iter().flat_map(|p| inputs(Path::new(p))) {
        let data = std::fs::read(&path).expect("read input");
        if !quiet {
            eprintln!("=== {} ({} bytes)", path.display(), data.len());
        }
        match panic::catch_unwind(|| check(&data)) {
            Ok(()) => passed += 1,
            Err(_) => {
                eprintln!("FAILED: {}", path.display());
                failed += 1;
            }
        }
    }
    eprintln!("{passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
