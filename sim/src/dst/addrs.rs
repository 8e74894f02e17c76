//! The simulated address book: how many replicas a set has and the address each is listed under
//! (in the cluster map, in not-leader hints, in the operator's seeds), and back from an address to
//! the replica. The transports and the group model both read it; it reads nothing of theirs.

/// Replicas in the group.
pub const REPLICAS: usize = 3;

/// The address of replica `r` of `set`, as the cluster map lists it.
pub fn store_addr(set: u64, r: usize) -> String {
    format!("storesvr-{set}-{r}:7100")
}

/// `(set, replica)` of a store address.
pub fn parse_store_addr(addr: &str) -> Option<(u64, usize)> {
    let rest = addr.strip_prefix("storesvr-")?.strip_suffix(":7100")?;
    let (set, r) = rest.split_once('-')?;
    let (set, r) = (set.parse().ok()?, r.parse().ok()?);
    (r < REPLICAS).then_some((set, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_addresses_round_trip_and_others_are_not_stores() {
        assert_eq!(parse_store_addr(&store_addr(1, 2)), Some((1, 2)));
        assert_eq!(parse_store_addr("storesvr-0-3:7100"), None, "no fourth replica");
        assert_eq!(parse_store_addr("allocsvr-0:7000"), None);
    }
}
