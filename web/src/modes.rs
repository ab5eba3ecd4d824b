//! Which modes a run steps through: a set of the partitioned modes, one step of each in turn,
//! named as the mode control and the links name it.
use serde::{Deserialize, Serialize};
use shardlab::plan::Mode;

/// A non-empty set of [`Mode::PARTITIONED`], run in that order (automatic, explicit,
/// shard_map). Written as a mode's name, a name for a set ([`SETS`]), or names joined by `+`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Modes {
    /// Bit k: `Mode::PARTITIONED[k]` runs.
    bits: u8,
}

/// The sets with a name of their own: automatic and shard_map, the pair the JAX report
/// compared, and all three.
const SETS: [(&str, &[Mode]); 2] = [("both", &[Mode::Auto, Mode::ShardMap]), ("all", &Mode::PARTITIONED)];

impl Modes {
    pub const BOTH: Modes = Modes::of(SETS[0].1);
    pub const ALL: Modes = Modes::of(SETS[1].1);

    /// The set of `modes` (each a partitioned mode; others are left out).
    pub const fn of(modes: &[Mode]) -> Modes {
        let mut bits = 0;
        let mut i = 0;
        while i < modes.len() {
            let mut k = 0;
            while k < Mode::PARTITIONED.len() {
                if Mode::PARTITIONED[k] as u8 == modes[i] as u8 {
                    bits |= 1 << k;
                }
                k += 1;
            }
            i += 1;
        }
        Modes { bits }
    }

    /// The modes, in the order they run.
    pub fn list(self) -> Vec<Mode> {
        (0..Mode::PARTITIONED.len())
            .filter(|k| self.bits & (1 << k) != 0)
            .map(|k| Mode::PARTITIONED[k])
            .collect()
    }

    /// What the mode control and the links write.
    pub fn name(self) -> String {
        match SETS.iter().find(|(_, set)| Modes::of(set) == self) {
            Some((name, _)) => name.to_string(),
            None => self.list().iter().map(|m| m.name()).collect::<Vec<_>>().join("+"),
        }
    }

    pub fn parse(text: &str) -> Result<Modes, String> {
        if let Some((_, set)) = SETS.iter().find(|(name, _)| *name == text) {
            return Ok(Modes::of(set));
        }
        let mut modes = vec![];
        for part in text.split('+') {
            match Mode::PARTITIONED.into_iter().find(|m| m.name() == part) {
                Some(m) => modes.push(m),
                None => {
                    let names: Vec<&str> = Mode::PARTITIONED.iter().map(|m| m.name()).collect();
                    let sets: Vec<&str> = SETS.iter().map(|(name, _)| *name).collect();
                    return Err(format!(
                        "mode “{text}” is not one of {}, {} or modes joined by +",
                        names.join(", "),
                        sets.join(", ")
                    ));
                }
            }
        }
        Ok(Modes::of(&modes))
    }
}

impl TryFrom<String> for Modes {
    type Error = String;
    fn try_from(text: String) -> Result<Modes, String> {
        Modes::parse(&text)
    }
}

impl From<Modes> for String {
    fn from(m: Modes) -> String {
        m.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_set_round_trips_through_its_name_and_runs_in_the_partitioned_order() {
        for name in [
            "auto",
            "shard_map",
            "explicit",
            "both",
            "all",
            "auto+explicit",
            "explicit+shard_map",
        ] {
            assert_eq!(Modes::parse(name).unwrap().name(), name);
        }
        assert_eq!(Modes::parse("shard_map+auto").unwrap(), Modes::BOTH);
        assert_eq!(Modes::BOTH.list(), [Mode::Auto, Mode::ShardMap]);
        assert_eq!(
            Modes::parse("all").unwrap().list(),
            [Mode::Auto, Mode::Explicit, Mode::ShardMap]
        );
    }

    #[test]
    fn an_unknown_mode_is_refused_naming_the_choices() {
        let e = Modes::parse("auto+single").unwrap_err();
        assert!(e.contains("auto, explicit, shard_map, both, all"), "{e}");
    }
}
