//! (being written)
/// The role check every server runs first.
#[derive(Clone, Debug, Default)]
pub struct AuthLayer;
