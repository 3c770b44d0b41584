//! midway-lab
