// Package archtest holds the repository's layout rules as tests: which
// packages may import internal/, and what a comment may say. It has no
// code of its own.
package archtest
