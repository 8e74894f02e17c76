//! StoreService client that follows leader hints (being written).
