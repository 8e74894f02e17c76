//! What the seed's actors beside the workload did, counted for the summary: the forger's calls
//! and the restores. The world keeps them; the forger and the restore add to them.

/// Forged calls sent and how many of them the store refused, over a seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Forged {
    pub sent: u64,
    pub refused: u64,
}

/// What the restores of a seed did, for the summary.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub restored: u64,
    /// Restores the production checks refused (the check against the map, a move in flight in
    /// the backup, no map to read) ...
    pub refused: u64,
    /// ... of which the check against the live map refused (a move since the backup, or running).
    pub refused_by_map: u64,
    /// Restores that went ahead without the map check although it would have refused (the
    /// negative control).
    pub unchecked: u64,
    /// What happened, one line each, for `sim dst --seed`.
    pub notes: Vec<String>,
    /// Each restore that went ahead: the set and, in run time, when its backup was taken and when
    /// it was restored. What the set decided in between is gone (the ledger checker excuses it).
    pub rewinds: Vec<Rewind>,
}

/// A set rewound to its backup: writes it applied from `backup_ns` until `restored_ns` are lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rewind {
    pub set: u64,
    pub backup_ns: u64,
    pub restored_ns: u64,
}
