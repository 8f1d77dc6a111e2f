//! A few seconds of the fuzz targets' properties (crates/fuzz, `RELIABILITY.md`) in the
//! normal test suite: every seed, then proptest inputs, both random and mutated seeds.
//! The properties themselves are the fuzz crate's own code, included here.

// The fuzz crate's files, declared at the top of the test crate (tests/it.rs): `seeds.rs`
// names `crate::msgs` and `crate::props`.
use crate::{props, seeds};

use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::select;

fn check(target: &str, data: &[u8]) {
    match target {
        "frames" => props::frames(data),
        "classify" => props::classify(data),
        "rewrite" => props::rewrite(data),
        "reply" => props::reply(data),
        other => panic!("unknown target {other}"),
    }
}

/// Every seed holds its property. With `FUZZ_CORPUS_DIR` set, the seeds that hold are also
/// written there as `<target>/seed-<n>` (how `crates/fuzz/run.sh` starts a corpus: the
/// fuzz crate's own binaries are instrumented and cannot run outside libFuzzer).
#[test]
fn every_seed_holds() {
    let out = std::env::var_os("FUZZ_CORPUS_DIR").map(std::path::PathBuf::from);
    for (target, corpus) in corpora() {
        assert!(corpus.len() >= 10, "{target}: {} seeds", corpus.len());
        for (i, s) in corpus.iter().enumerate() {
            let r = std::panic::catch_unwind(|| check(target, s));
            assert!(r.is_ok(), "{target} seed {i} fails its property");
        }
        if let Some(dir) = &out {
            let d = dir.join(target);
            std::fs::create_dir_all(&d).expect("corpus directory");
            for (i, s) in corpus.iter().enumerate() {
                std::fs::write(d.join(format!("seed-{i:03}")), s).expect("seed written");
            }
        }
    }
}

/// The seeds exercise what they are meant to: generated commands classify exactly (a
/// property that can fail), and real messages open to a body.
#[test]
fn seeds_reach_the_deep_paths() {
    let opened = seeds::requests()
        .iter()
        .filter(|m| {
            let frame = bytes::Bytes::copy_from_slice(m);
            staleguard::wire::Request::open(frame, props::FUZZ_MAX)
                .is_ok_and(|r| r.body().is_some())
        })
        .count();
    assert!(opened >= 50, "only {opened} seed requests open to a body");
    for r in seeds::replies() {
        staleguard::wire::inspect_reply(&r, props::FUZZ_MAX).expect("seed replies inspect");
    }
}

/// A target and its seed inputs.
type Corpus = (&'static str, Vec<Vec<u8>>);

/// Every target's seeds, built once.
fn corpora() -> &'static Vec<Corpus> {
    static CORPORA: OnceLock<Vec<Corpus>> = OnceLock::new();
    CORPORA.get_or_init(|| {
        seeds::TARGETS
            .iter()
            .map(|&t| (t, seeds::corpus(t)))
            .collect()
    })
}

fn any_target() -> impl Strategy<Value = &'static str> {
    select(seeds::TARGETS.to_vec())
}

/// A seed of `target` with up to 12 bytes overwritten and maybe cut short.
fn mutated_seed() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    select(corpora().clone()).prop_flat_map(|(t, corpus)| {
        (
            Just(t),
            select(corpus),
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..12),
            any::<bool>(),
            any::<usize>(),
        )
            .prop_map(|(t, mut s, edits, cut, at)| {
                for (i, v) in edits {
                    let n = s.len();
                    if n > 0 {
                        s[i % n] = v;
                    }
                }
                if cut && !s.is_empty() {
                    s.truncate(at % s.len());
                }
                (t, s)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn properties_hold_on_random_bytes(
        target in any_target(),
        data in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        check(target, &data);
    }

    #[test]
    fn properties_hold_on_mutated_seeds((target, data) in mutated_seed()) {
        check(target, &data);
    }
}
