//! The simulation's one source of choices.
//!
//! From a seed it is ChaCha8 (a seed replays exactly). From bytes — what a fuzzer hands the
//! structure-aware targets under `fuzz/` — every choice the world makes (network delays,
//! loss, duplication, crash points, rogue messages, the scenario itself) is read from the
//! bytes in order, so the fuzzer steers the schedule and keeps the inputs that reach new code;
//! once the bytes run out, the rest comes from ChaCha8 seeded with a hash of them, so a run
//! is still a pure function of its input.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A seeded ChaCha8 stream, or fuzzer bytes followed by one.
#[derive(Clone, Debug)]
pub struct SimRng {
    bytes: Vec<u8>,
    at: usize,
    rest: ChaCha8Rng,
}

impl SimRng {
    /// Exactly `ChaCha8Rng::seed_from_u64(seed)`.
    pub fn seeded(seed: u64) -> Self {
        Self {
            bytes: Vec::new(),
            at: 0,
            rest: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// Choices read from `bytes`, then from a stream seeded by their FNV-1a hash.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Self {
            bytes: bytes.to_vec(),
            at: 0,
            rest: ChaCha8Rng::seed_from_u64(hash),
        }
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let chunk = self.bytes.get(self.at..self.at + N)?;
        self.at += N;
        chunk.try_into().ok()
    }
}

impl RngCore for SimRng {
    fn next_u32(&mut self) -> u32 {
        match self.take::<4>() {
            Some(b) => u32::from_le_bytes(b),
            None => self.rest.next_u32(),
        }
    }

    fn next_u64(&mut self) -> u64 {
        match self.take::<8>() {
            Some(b) => u64::from_le_bytes(b),
            None => self.rest.next_u64(),
        }
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        let from_input = dst.len().min(self.bytes.len() - self.at);
        dst[..from_input].copy_from_slice(&self.bytes[self.at..self.at + from_input]);
        self.at += from_input;
        self.rest.fill_bytes(&mut dst[from_input..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_is_the_chacha_stream_and_bytes_come_first() {
        let mut a = SimRng::seeded(42);
        let mut b = ChaCha8Rng::seed_from_u64(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = SimRng::from_bytes(&[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 9]);
        assert_eq!(r.next_u32(), 1);
        assert_eq!(r.next_u64(), 2);
        let mut tail = [0u8; 3];
        r.fill_bytes(&mut tail);
        assert_eq!(tail[0], 9, "the last input byte, then the hashed stream");
        // The same input replays; a different one does not.
        let run = |b: &[u8]| {
            let mut r = SimRng::from_bytes(b);
            (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(run(b"abc"), run(b"abc"));
        assert_ne!(run(b"abc"), run(b"abd"));
    }
}
