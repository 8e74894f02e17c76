//! The pure parts of `cost-curves`: which uids each curve asks for, the rows it prints, and the
//! extrapolation from the measured curves to the full uid space.
//!
//! Deliberately left out: anything that talks to a server (see [`crate::cluster`] and
//! [`crate::load`]), and any model of a machine other than the one measured: the extrapolation
//! scales the measured per-node figures linearly and says so.

/// The uid space the extrapolation covers: every `u32` uid.
pub const UID_SPACE: u64 = 1 << 32;

/// 10^3, 10^4, …, 10^`max_exp`.
pub fn uid_counts(max_exp: u32) -> Vec<u64> {
    (3..=max_exp).map(|e| 10u64.pow(e)).collect()
}

/// Sections one batch spans: powers of two up to `max`, and `max` itself.
pub fn spans(max: usize) -> Vec<usize> {
    let mut out: Vec<usize> = (0..).map(|k| 1usize << k).take_while(|s| *s < max).collect();
    out.push(max);
    out
}

/// AllocSvr counts: powers of two up to `max`, and `max` itself.
pub fn allocsvr_counts(max: usize) -> Vec<usize> {
    spans(max)
}

/// Sections the first `count` uids from section `first` lie in.
pub fn sections_of(first: u64, count: u64, section_size: u64) -> Vec<u64> {
    (first..first + count.div_ceil(section_size)).collect()
}

/// `n` hot uids, one per section, spread evenly over the sections `[begin, end)` (offset 7 in
/// each): every one is its section's hottest uid, so each crosses step boundaries on its own.
pub fn hot_uids(begin: u64, end: u64, n: usize, section_size: u64) -> Vec<u64> {
    let len = end.saturating_sub(begin);
    let n = (n as u64).min(len);
    (0..n).map(|i| (begin + i * len / n) * section_size + 7).collect()
}

/// `total` callers split over `k` servers as evenly as possible (at least one each).
pub fn split(total: usize, k: usize) -> Vec<usize> {
    (0..k)
        .map(|i| (total / k + usize::from(i < total % k)).max(1))
        .collect()
}

/// What the extrapolation starts from: measured figures and two stated assumptions.
#[derive(Debug, Clone, Copy)]
pub struct Inputs {
    /// RSS per touched uid at the largest measured count (allocator overhead included).
    pub bytes_per_uid: f64,
    /// RSS of an AllocSvr that owns every section but has touched none.
    pub base_rss: f64,
    /// What one AllocSvr served (batch100, at the largest measured count, this machine).
    pub seqs_per_sec_per_node: f64,
    /// Assumed aggregate demand, seqs/s.
    pub demand: f64,
    /// RAM one AllocSvr may use, bytes.
    pub ram_budget: f64,
    pub section_size: u64,
    pub step: u64,
}

/// How many AllocSvrs and how much RAM the full uid space needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sizing {
    pub sections: u64,
    /// Bytes of `cur_seq` arrays once every uid is touched.
    pub arrays: f64,
    pub nodes_for_ram: u64,
    pub nodes_for_rate: u64,
    pub nodes: u64,
    pub sections_per_node: u64,
    /// Worst node's RSS: its base plus its sections' arrays.
    pub ram_per_node: f64,
    pub ram_total: f64,
    /// At most one bump per section per `step` seqs: the store's bump items/s at that demand.
    pub bumps_per_sec: f64,
}

/// The sizing, or why there is none (a budget below the base RSS, a rate of 0).
pub fn size(i: &Inputs) -> Result<Sizing, String> {
    let usable = i.ram_budget - i.base_rss;
    if usable <= 0.0 {
        return Err(format!(
            "RAM budget {:.0} bytes is not above an idle AllocSvr's RSS {:.0}",
            i.ram_budget, i.base_rss
        ));
    }
    if i.seqs_per_sec_per_node <= 0.0 || i.bytes_per_uid <= 0.0 || i.section_size == 0 || i.step == 0 {
        return Err("measured rate, bytes per uid, section size and step must be positive".into());
    }
    let sections = UID_SPACE.div_ceil(i.section_size);
    let arrays = UID_SPACE as f64 * i.bytes_per_uid;
    let section_bytes = i.section_size as f64 * i.bytes_per_uid;
    // Sections are the unit of ownership: a node holds whole sections, so fit sections, not bytes.
    let sections_fit = (usable / section_bytes).floor() as u64;
    if sections_fit == 0 {
        return Err("not one section fits in the RAM budget".into());
    }
    let nodes_for_ram = sections.div_ceil(sections_fit);
    let nodes_for_rate = (i.demand / i.seqs_per_sec_per_node).ceil().max(1.0) as u64;
    let nodes = nodes_for_ram.max(nodes_for_rate);
    let sections_per_node = sections.div_ceil(nodes);
    let ram_per_node = i.base_rss + sections_per_node as f64 * section_bytes;
    Ok(Sizing {
        sections,
        arrays,
        nodes_for_ram,
        nodes_for_rate,
        nodes,
        sections_per_node,
        ram_per_node,
        ram_total: nodes as f64 * i.base_rss + arrays,
        bumps_per_sec: i.demand / i.step as f64,
    })
}

/// The sizing as lines of text with the arithmetic spelled out.
pub fn sizing_lines(i: &Inputs, s: &Sizing) -> Vec<String> {
    let section_bytes = i.section_size as f64 * i.bytes_per_uid;
    vec![
        format!(
            "uid space 2^32 = {UID_SPACE} uids = {} sections of {}",
            s.sections, i.section_size
        ),
        format!(
            "cur_seq arrays, every uid touched: {UID_SPACE} x {:.2} bytes/uid (measured) = {}",
            i.bytes_per_uid,
            gib(s.arrays)
        ),
        format!(
            "RAM: budget {} - idle AllocSvr RSS {} (measured) = {} usable per node = {} sections of {} ({} uids x {:.2} bytes)",
            gib(i.ram_budget),
            gib(i.base_rss),
            gib(i.ram_budget - i.base_rss),
            ((i.ram_budget - i.base_rss) / section_bytes).floor(),
            gib(section_bytes),
            i.section_size,
            i.bytes_per_uid
        ),
        format!(
            "nodes for RAM: ceil({} sections / {} per node) = {}",
            s.sections,
            ((i.ram_budget - i.base_rss) / section_bytes).floor(),
            s.nodes_for_ram
        ),
        format!(
            "nodes for rate: ceil({:.0} seqs/s demand (assumed) / {:.0} seqs/s per node (measured)) = {}",
            i.demand, i.seqs_per_sec_per_node, s.nodes_for_rate
        ),
        format!(
            "AllocSvrs: max({}, {}) = {}, each {} sections = {} RSS (<= budget {}); all together {}",
            s.nodes_for_ram,
            s.nodes_for_rate,
            s.nodes,
            s.sections_per_node,
            gib(s.ram_per_node),
            gib(i.ram_budget),
            gib(s.ram_total)
        ),
        format!(
            "StoreSvr: at most one bump per section per step: {:.0} seqs/s / step {} = {:.0} bump items/s at most",
            i.demand, i.step, s.bumps_per_sec
        ),
    ]
}

/// Bytes as GiB (or MiB below one GiB), for the sizing lines.
pub fn gib(bytes: f64) -> String {
    if bytes >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes / (1u64 << 20) as f64)
    }
}

/// `1234567.8` → `1,234,568`: the tables' number format.
pub fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 && digits != "0" {
        out.insert(0, '-');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::Uids;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    #[test]
    fn lists() {
        assert_eq!(uid_counts(5), vec![1_000, 10_000, 100_000]);
        assert_eq!(spans(100), vec![1, 2, 4, 8, 16, 32, 64, 100]);
        assert_eq!(spans(1), vec![1]);
        assert_eq!(allocsvr_counts(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(allocsvr_counts(6), vec![1, 2, 4, 6]);
        assert_eq!(sections_of(10, 1_000, 100_000), vec![10]);
        assert_eq!(sections_of(10, 100_001, 100_000), vec![10, 11]);
        assert_eq!(split(64, 16), vec![4; 16]);
        assert_eq!(split(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(split(2, 4), vec![1, 1, 1, 1]);
    }

    #[test]
    fn hot_uids_one_per_section_inside_the_range() {
        let u = hot_uids(100, 200, 8, 1_000);
        assert_eq!(u.len(), 8);
        let sections: BTreeSet<u64> = u.iter().map(|x| x / 1_000).collect();
        assert_eq!(sections.len(), 8);
        assert!(sections.iter().all(|s| (100..200).contains(s)));
        assert_eq!(hot_uids(5, 7, 8, 10).len(), 2, "no more than the range has");
    }

    #[test]
    fn striped_batches_span_exactly_their_sections() {
        let pool: Vec<u64> = (500..600).collect();
        let mut rng = 0x1234_5678_9abc_def1u64;
        for span in spans(100) {
            let uids = Uids::Striped {
                sections: Arc::new(pool.clone()),
                section_size: 100_000,
                span,
            };
            for _ in 0..50 {
                let b = uids.batch(100, &mut rng);
                assert_eq!(b.len(), 100);
                let sections: BTreeSet<u64> = b.iter().map(|u| u / 100_000).collect();
                assert_eq!(sections.len(), span, "span {span}");
                assert!(sections.iter().all(|s| (500..600).contains(s)));
            }
        }
    }

    #[test]
    fn range_stays_inside() {
        let uids = Uids::Range {
            first: 7_000,
            count: 1_000,
        };
        let mut rng = 99u64;
        let b = uids.batch(10_000, &mut rng);
        assert!(b.iter().all(|u| (7_000..8_000).contains(u)));
        assert!(b.iter().collect::<BTreeSet<_>>().len() > 900, "spread over the range");
    }

    fn inputs() -> Inputs {
        Inputs {
            bytes_per_uid: 8.0,
            base_rss: 100.0 * (1u64 << 20) as f64,
            seqs_per_sec_per_node: 1_000_000.0,
            demand: 10_000_000.0,
            ram_budget: 8.0 * (1u64 << 30) as f64,
            section_size: 100_000,
            step: 10_000,
        }
    }

    #[test]
    fn sizing_arithmetic() {
        let s = size(&inputs()).unwrap();
        assert_eq!(s.sections, 42_950);
        assert_eq!(s.arrays, 34_359_738_368.0);
        // (8 GiB - 100 MiB) / 800,000 bytes = 10,606.5 → 10,606 sections per node.
        assert_eq!(s.nodes_for_ram, 42_950u64.div_ceil(10_606));
        assert_eq!(s.nodes_for_ram, 5);
        assert_eq!(s.nodes_for_rate, 10);
        assert_eq!(s.nodes, 10);
        assert_eq!(s.sections_per_node, 4_295);
        assert_eq!(s.ram_per_node, 100.0 * (1u64 << 20) as f64 + 4_295.0 * 800_000.0);
        assert_eq!(s.bumps_per_sec, 1_000.0);
        assert_eq!(sizing_lines(&inputs(), &s).len(), 7);
        let slow = Inputs {
            demand: 1.0,
            ..inputs()
        };
        assert_eq!(size(&slow).unwrap().nodes, 5, "RAM decides when the demand is low");
    }

    #[test]
    fn sizing_refuses_impossible_budgets() {
        let tiny = Inputs {
            ram_budget: 50.0 * (1u64 << 20) as f64,
            ..inputs()
        };
        assert!(size(&tiny).is_err());
        let no_rate = Inputs {
            seqs_per_sec_per_node: 0.0,
            ..inputs()
        };
        assert!(size(&no_rate).is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(-1_000.0), "-1,000");
        assert_eq!(gib(8.0 * (1u64 << 30) as f64), "8.00 GiB");
        assert_eq!(gib(1_048_576.0), "1.0 MiB");
    }
}
