// Package ocicli is what cella's two wrappers of runc-compatible command
// lines, crun and gvisor (runsc), share: the host accounting of their
// containers' cgroups (both put them at /cella/<id>) and the removal of
// what containers left there. The flags and quirks of each CLI stay in its
// own package.
package ocicli
