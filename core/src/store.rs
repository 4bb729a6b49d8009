//! The contract of the store that holds the pool document. (Being written.)
