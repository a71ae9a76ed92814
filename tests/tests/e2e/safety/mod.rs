//! What no command may do to a target or to the machine, however it is stopped: leave
//! anything attached or changed, harm a target, leak descriptors or memory over weeks,
//! or overstep its privileges.

mod churn;
mod descriptors;
mod reliability;
mod security;
