//! Writes the committed seed corpora, `fuzz/seeds/<target>/`, from packets and scenarios built
//! in `meridian_fuzz::seeds`. Deterministic: running it again rewrites the same files.
//!
//! ```sh
//! cargo run --release --manifest-path fuzz/Cargo.toml --example gen_seeds
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use meridian_core::codec::ProtocolVersion;
use meridian_fuzz::seeds;

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).expect("create seed directory");
    fs::write(dir.join(name), bytes).expect("write seed");
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let mut count = 0;

    for (target, version) in [
        ("codec_v311", ProtocolVersion::V311),
        ("codec_v5", ProtocolVersion::V5),
    ] {
        let dir = root.join(target);
        for (name, bytes) in seeds::codec_seeds(version) {
            // Every seed must pass its own target's check.
            meridian_fuzz::codec::check(&bytes, version);
            write(&dir, &name, &bytes);
            count += 1;
        }
    }

    let dir = root.join("broker_sequence");
    for (name, ops) in seeds::broker_seeds() {
        let (bytes, expected) = seeds::broker_scenario(&ops);
        assert_eq!(seeds::broker_ops_text(&bytes), expected, "seed {name}");
        meridian_fuzz::broker::check(&bytes);
        write(&dir, &name, &bytes);
        count += 1;
    }

    let dir = root.join("topic_match");
    for (name, filters, topics) in seeds::topic_seeds() {
        let bytes = seeds::topic_scenario(&filters, &topics);
        seeds::check_scenario::<meridian_fuzz::topic::Scenario>(
            &bytes,
            &seeds::topic_expected(&filters, &topics),
        );
        meridian_fuzz::topic::check(&bytes);
        write(&dir, name, &bytes);
        count += 1;
    }

    let dir = root.join("link_frame");
    for (name, bytes) in seeds::link_seeds() {
        meridian_fuzz::link::check(&bytes);
        write(&dir, &name, &bytes);
        count += 1;
    }

    let dir = root.join("route_merge");
    for (name, budget, chunk, ops) in seeds::route_seeds() {
        let (bytes, expected) = seeds::route_scenario(budget, chunk, &ops);
        seeds::check_scenario::<meridian_fuzz::routes::Scenario>(&bytes, &expected);
        meridian_fuzz::routes::check(&bytes);
        write(&dir, name, &bytes);
        count += 1;
    }

    eprintln!("wrote {count} seed files under {}", root.display());
}
