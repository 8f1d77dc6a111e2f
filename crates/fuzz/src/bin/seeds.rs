//! Writes the seed corpora: `seeds DIR` creates `DIR/<target>/seed-<n>` for every target.

use std::path::PathBuf;

use staleguard_fuzz::seeds::{corpus, TARGETS};

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    for target in TARGETS {
        let d = dir.join(target);
        std::fs::create_dir_all(&d)?;
        let seeds = corpus(target);
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(d.join(format!("seed-{i:03}")), s)?;
        }
        println!("{}: {} seeds", d.display(), seeds.len());
    }
    Ok(())
}
