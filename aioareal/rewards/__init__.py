"""The reward service: `service` scores each finished group off the event loop under one deadline
(threads, then worker processes from `isolation`) and counts every failure."""
