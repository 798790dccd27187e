//! The impairment of one direction, in `tc netem` words.
//!
//! ```text
//! loss 5%                          independent loss
//! loss gemodel 1% 30% [100% [0%]]  Gilbert–Elliott: p (good→bad), r (bad→good), 1-h (loss when
//!                                  bad, default 100%), 1-k (loss when good, default 0%)
//! delay 20ms [5ms]                 delay with uniform jitter of ± the second value
//! duplicate 1%                     a second copy
//! reorder 10%                      that share skips the delay (needs a delay), as netem does
//! rate 10mbit                      serialization at this rate (bit, kbit, mbit, gbit)
//! limit 1000                       queue limit in packets (tail drop); default 1000
//! partition 5s 2s                  a blackhole from 5 s after start, for 2 s (repeatable)
//! ```

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Loss model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Loss {
    /// No loss.
    None,
    /// Each packet lost independently with this probability.
    Random(f64),
    /// Two-state Gilbert–Elliott model (`tc netem loss gemodel`).
    GilbertElliott {
        /// P(good → bad) per packet.
        p: f64,
        /// P(bad → good) per packet.
        r: f64,
        /// Loss probability in the bad state (1 - h).
        bad_loss: f64,
        /// Loss probability in the good state (1 - k).
        good_loss: f64,
    },
}

impl Loss {
    /// The long-run loss rate.
    pub fn expected_rate(&self) -> f64 {
        match *self {
            Loss::None => 0.0,
            Loss::Random(p) => p,
            Loss::GilbertElliott {
                p,
                r,
                bad_loss,
                good_loss,
            } => {
                if p + r == 0.0 {
                    good_loss
                } else {
                    (p * bad_loss + r * good_loss) / (p + r)
                }
            }
        }
    }
}

/// The impairment of one direction.
#[derive(Clone, Debug, PartialEq)]
pub struct Impairment {
    /// Loss model.
    pub loss: Loss,
    /// Base one-way delay.
    pub delay: Duration,
    /// Uniform jitter: delay is drawn from `[delay - jitter, delay + jitter]`.
    pub jitter: Duration,
    /// Duplication probability.
    pub duplicate: f64,
    /// Probability that a packet skips the delay (is reordered ahead).
    pub reorder: f64,
    /// Link rate in bits per second.
    pub rate_bps: Option<u64>,
    /// Queue limit in packets.
    pub limit: usize,
    /// Blackhole windows: (start after the emulator starts, duration).
    pub partitions: Vec<(Duration, Duration)>,
}

impl Default for Impairment {
    fn default() -> Self {
        Self {
            loss: Loss::None,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            duplicate: 0.0,
            reorder: 0.0,
            rate_bps: None,
            limit: 1_000,
            partitions: Vec::new(),
        }
    }
}

/// Why an impairment string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A word this vocabulary does not have.
    #[error("unknown word {0:?}")]
    UnknownWord(String),
    /// A word is missing its value.
    #[error("{0} needs a value")]
    MissingValue(&'static str),
    /// A percentage that does not parse or lies outside [0%, 100%].
    #[error("bad percentage {0:?} (write e.g. 5% or 0.5%)")]
    Percent(String),
    /// A time that does not parse (us, ms, s).
    #[error("bad time {0:?} (write e.g. 20ms, 500us, 2s)")]
    Time(String),
    /// A rate that does not parse (bit, kbit, mbit, gbit).
    #[error("bad rate {0:?} (write e.g. 10mbit)")]
    Rate(String),
    /// A count that does not parse.
    #[error("bad number {0:?}")]
    Number(String),
    /// `reorder` without a delay to skip.
    #[error("reorder needs a delay")]
    ReorderWithoutDelay,
}

fn percent(s: &str) -> Result<f64, SpecError> {
    let v: f64 = s
        .strip_suffix('%')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| SpecError::Percent(s.to_owned()))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(SpecError::Percent(s.to_owned()));
    }
    Ok(v / 100.0)
}

/// Parses `20ms`, `500us`, `2s`, `1.5s`.
pub fn parse_time(s: &str) -> Result<Duration, SpecError> {
    let err = || SpecError::Time(s.to_owned());
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        return Err(err());
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    let secs = v * scale;
    if !(0.0..1e6).contains(&secs) {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn rate(s: &str) -> Result<u64, SpecError> {
    let err = || SpecError::Rate(s.to_owned());
    let lower = s.to_ascii_lowercase();
    let (num, scale) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .into_iter()
        .find_map(|(suffix, scale)| lower.strip_suffix(suffix).map(|n| (n.to_owned(), scale)))
        .ok_or_else(err)?;
    let v: f64 = num.parse().map_err(|_| err())?;
    if !(v > 0.0 && v * scale < 1e12) {
        return Err(err());
    }
    Ok((v * scale) as u64)
}

impl FromStr for Impairment {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let mut spec = Impairment::default();
        let mut i = 0;
        let next = |i: &mut usize, what: &'static str| -> Result<&str, SpecError> {
            *i += 1;
            words.get(*i).copied().ok_or(SpecError::MissingValue(what))
        };
        // An optional trailing value: present when it parses.
        let optional = |i: usize, f: &dyn Fn(&str) -> bool| words.get(i + 1).is_some_and(|w| f(w));
        while i < words.len() {
            match words[i] {
                "loss" => {
                    let v = next(&mut i, "loss")?;
                    if v == "gemodel" {
                        let p = percent(next(&mut i, "loss gemodel")?)?;
                        let r = percent(next(&mut i, "loss gemodel")?)?;
                        let mut bad_loss = 1.0;
                        let mut good_loss = 0.0;
                        if optional(i, &|w| percent(w).is_ok()) {
                            bad_loss = percent(next(&mut i, "loss gemodel")?)?;
                            if optional(i, &|w| percent(w).is_ok()) {
                                good_loss = percent(next(&mut i, "loss gemodel")?)?;
                            }
                        }
                        spec.loss = Loss::GilbertElliott {
                            p,
                            r,
                            bad_loss,
                            good_loss,
                        };
                    } else {
                        spec.loss = Loss::Random(percent(v)?);
                    }
                }
                "delay" => {
                    spec.delay = parse_time(next(&mut i, "delay")?)?;
                    if optional(i, &|w| parse_time(w).is_ok()) {
                        spec.jitter = parse_time(next(&mut i, "delay")?)?;
                    }
                }
                "duplicate" => spec.duplicate = percent(next(&mut i, "duplicate")?)?,
                "reorder" => spec.reorder = percent(next(&mut i, "reorder")?)?,
                "rate" => spec.rate_bps = Some(rate(next(&mut i, "rate")?)?),
                "limit" => {
                    let v = next(&mut i, "limit")?;
                    spec.limit = v.parse().map_err(|_| SpecError::Number(v.to_owned()))?;
                }
                "partition" => {
                    let start = parse_time(next(&mut i, "partition")?)?;
                    let length = parse_time(next(&mut i, "partition")?)?;
                    spec.partitions.push((start, length));
                }
                other => return Err(SpecError::UnknownWord(other.to_owned())),
            }
            i += 1;
        }
        if spec.reorder > 0.0 && spec.delay.is_zero() {
            return Err(SpecError::ReorderWithoutDelay);
        }
        Ok(spec)
    }
}

impl fmt::Display for Impairment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words = Vec::new();
        match self.loss {
            Loss::None => {}
            Loss::Random(p) => words.push(format!("loss {}%", p * 100.0)),
            Loss::GilbertElliott {
                p,
                r,
                bad_loss,
                good_loss,
            } => words.push(format!(
                "loss gemodel {}% {}% {}% {}%",
                p * 100.0,
                r * 100.0,
                bad_loss * 100.0,
                good_loss * 100.0
            )),
        }
        if !self.delay.is_zero() {
            words.push(format!(
                "delay {}us {}us",
                self.delay.as_micros(),
                self.jitter.as_micros()
            ));
        }
        if self.duplicate > 0.0 {
            words.push(format!("duplicate {}%", self.duplicate * 100.0));
        }
        if self.reorder > 0.0 {
            words.push(format!("reorder {}%", self.reorder * 100.0));
        }
        if let Some(r) = self.rate_bps {
            words.push(format!("rate {r}bit limit {}", self.limit));
        }
        for (start, length) in &self.partitions {
            words.push(format!(
                "partition {}us {}us",
                start.as_micros(),
                length.as_micros()
            ));
        }
        f.write_str(&words.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_netem_vocabulary() {
        let s: Impairment =
            "loss 5% delay 20ms 5ms duplicate 1% reorder 10% rate 10mbit limit 100 partition 5s 2s"
                .parse()
                .unwrap();
        assert_eq!(s.loss, Loss::Random(0.05));
        assert_eq!(
            (s.delay, s.jitter),
            (Duration::from_millis(20), Duration::from_millis(5))
        );
        assert_eq!((s.duplicate, s.reorder), (0.01, 0.1));
        assert_eq!((s.rate_bps, s.limit), (Some(10_000_000), 100));
        assert_eq!(
            s.partitions,
            [(Duration::from_secs(5), Duration::from_secs(2))]
        );
        // Display gives back something that parses to the same.
        assert_eq!(s.to_string().parse::<Impairment>().unwrap(), s);
        let g: Impairment = "loss gemodel 1% 30%".parse().unwrap();
        assert_eq!(
            g.loss,
            Loss::GilbertElliott {
                p: 0.01,
                r: 0.3,
                bad_loss: 1.0,
                good_loss: 0.0
            }
        );
        let g: Impairment = "loss gemodel 1% 30% 80% 0.5% delay 1ms".parse().unwrap();
        assert!(
            matches!(g.loss, Loss::GilbertElliott { bad_loss, good_loss, .. } if bad_loss == 0.8 && good_loss == 0.005)
        );
        assert_eq!(g.delay, Duration::from_millis(1));
        assert_eq!("".parse::<Impairment>().unwrap(), Impairment::default());
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        assert_eq!(
            "lose 5%".parse::<Impairment>(),
            Err(SpecError::UnknownWord("lose".into()))
        );
        assert_eq!(
            "loss".parse::<Impairment>(),
            Err(SpecError::MissingValue("loss"))
        );
        assert_eq!(
            "loss 5".parse::<Impairment>(),
            Err(SpecError::Percent("5".into()))
        );
        assert_eq!(
            "loss 120%".parse::<Impairment>(),
            Err(SpecError::Percent("120%".into()))
        );
        assert_eq!(
            "delay 20".parse::<Impairment>(),
            Err(SpecError::Time("20".into()))
        );
        assert_eq!(
            "rate fast".parse::<Impairment>(),
            Err(SpecError::Rate("fast".into()))
        );
        assert_eq!(
            "reorder 10%".parse::<Impairment>(),
            Err(SpecError::ReorderWithoutDelay)
        );
    }

    #[test]
    fn gilbert_elliott_long_run_rate() {
        let l = Loss::GilbertElliott {
            p: 0.01,
            r: 0.3,
            bad_loss: 1.0,
            good_loss: 0.0,
        };
        assert!((l.expected_rate() - 0.01 / 0.31).abs() < 1e-12);
    }
}
