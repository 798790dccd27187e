//! netem-style packet impairment in userspace.
//!
//! Kernel netem is not available on every machine this runs on, so the impairment rules are
//! ours: a pure per-packet core ([`Emulator`]) that takes time as an argument and draws every
//! random choice from a seed, configured in `tc netem` words ([`Impairment`]), and a UDP relay
//! shell ([`relay`]) to put between unmodified nodes.
//!
//! ```
//! use abhyasa_netem::{Emulator, Impairment, Verdict};
//!
//! let spec: Impairment = "loss 5% delay 20ms 5ms".parse().unwrap();
//! let mut link = Emulator::new(spec, 42);
//! match link.handle_packet(0, 1200) {
//!     Verdict::Deliver(at) => assert!(at.iter().all(|t| (15_000..=25_000).contains(t))),
//!     Verdict::Drop(reason) => println!("dropped: {reason:?}"),
//! }
//! ```

#![warn(missing_docs, unreachable_pub)]

mod emulator;
#[cfg(feature = "relay")]
pub mod relay;
mod spec;

pub use emulator::{DropReason, Emulator, Stats, Verdict};
pub use spec::{parse_time, Impairment, Loss, SpecError};
