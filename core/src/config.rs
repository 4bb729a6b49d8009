//! Every setting Corral reads, with its default, parsed fail-closed. (Being written.)
