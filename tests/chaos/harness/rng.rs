//! The run's one source of chance (xorshift64*): the plan and every task's choices come from
//! it, each task from a stream forked off at plan time, so a seed replays the same plan
//! whatever order the tasks run in.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// A number in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// `d` stretched or shrunk by up to `spread` (0.2: 80 % to 120 %).
    pub fn jitter(&mut self, d: Duration, spread: f64) -> Duration {
        let f = 1.0 - spread + 2.0 * spread * self.unit();
        d.mul_f64(f.max(0.0))
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An independent stream for one task.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }
}
