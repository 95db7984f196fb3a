// Package fill solves the "fill puzzle pieces" puzzle (Programmers 84021).
//
// The input is two R×C grids of 0/1. Pieces are the 4-connected groups of
// 1s in the table; holes are the 4-connected groups of 0s in the game
// board (diagonal contact does not connect). A piece may go into a hole
// only if, after a rotation by 0, 90, 180 or 270 degrees (and, with
// Options.AllowFlip, an optional left-right mirror), it has exactly the
// hole's shape. Each piece is used at most once; the answer is the largest
// number of board cells that can be filled.
//
// # Why the greedy is optimal
//
// "Fits into" is an equivalence relation: a piece fits a hole iff both
// have the same shape up to the allowed transformations, i.e. the same
// canonical form. The pieces and holes therefore split into independent
// shape classes, and inside one class every piece fits every hole and all
// have the same size s. No placement in one class affects another, so the
// optimum is the sum over classes of min(#pieces, #holes)·s, and any
// greedy that pairs pieces with holes of their class until one side runs
// out reaches it. The textbook solution (first fitting piece for each
// hole) is such a greedy; it is merely slow, comparing every hole with
// every piece.
//
// # Method
//
// Solve copies both grids into flat, padded []uint8 buffers (the border
// row and column make neighbour checks branch-free of bounds tests), then
// finds the groups with an iterative breadth-first flood fill that uses
// the output cell list itself as the queue: no recursion, so a 1000×1000
// single region cannot overflow the stack, and no per-cell allocation.
// Holes are found in row-major order of their first cell, pieces likewise.
//
// A group whose bounding box fits 8×8 (the common case: every polyomino
// of up to 8 cells) is keyed exactly: its normalised cell set is an 8×8
// bitmap in a uint64, built in one pass over its cells, and the other
// rotations and mirrors come from a few word operations on that bitmap
// (byte swap, reversing the bits of each byte, an 8×8 transpose, a shift
// back to the origin). The canonical key is the smallest of these
// bitmaps. The key is the shape, so congruent groups, and only they, get
// the same key: no hash, no collision, no cell-by-cell verification. The
// keys index their own open-addressing table of classes. Because the same
// few shapes in the same few orientations make up most groups, canonical
// forms go through a small direct-mapped cache keyed by the raw bitmap;
// the mapping is a pure function, so the cache lives with the pooled
// scratch and is never cleared.
//
// Larger groups get a canonical key without sorting their cells: for every
// allowed transformation t the normalised transformed cell set gets the
// order-independent hash Σ A[x]·B[y] over its cells (x, y), with fixed
// pseudo-random 64-bit tables A and B. All 4 (or 8) hashes come out of one
// pass over the cells. The key is the smallest hash over the
// transformations together with the cell count, so congruent shapes get
// the same key. Keys index an open-addressing table of shape classes
// whose representatives are holes. Because a hash can collide, a group is
// only admitted to a class after an exact cell-by-cell check: the
// candidate transformation, composed with the inverse of the
// representative's, is an affine map from the group's cells to board
// indices, and each image must carry the representative's label (only
// representatives of large classes are labelled, and the labels are
// cleared after the solve, so no buffer is cleared per solve). Hash
// collisions therefore cost time but never give a wrong answer. The whole
// solve is linear in the number of cells.
//
// Why a hash and not the literal smallest encoding for larger groups:
// comparing encodings needs each group's cells sorted under every
// transformation (n log n per group) or a bitmap of its bounding box,
// which for a staircase of n cells is n²/4 bits; the sum of products
// needs neither. Up to 8×8 the bitmap is one word, which is why small
// groups take the exact path. The tables are fixed
// rather than seeded per process so that the reported rotation of a
// symmetric piece never varies between runs; the price is that inputs
// crafted to collide could make class lookup quadratic in the number of
// colliding classes, never wrong.
//
// Pieces are then matched, in order, with the first still-empty hole of
// their class (the same pairing the textbook produces), and every
// Placement lists the piece's cells and, index for index, the board cells
// they land on, with the rotation (and mirror) that maps one to the other.
package fill
