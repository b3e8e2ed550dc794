package projections

import (
	"slices"
	"strings"
)

// idBlock is the most ids one block of an idIndex holds before it splits.
const idBlock = 512

// idIndex holds one customer's task ids in order, in sorted blocks of at
// most idBlock ids: adding or removing an id costs a binary search and a
// copy within one block, and a walk from any id reads only the ids it
// passes. It is not safe for concurrent use; the Engine guards it.
type idIndex struct {
	blocks [][]string // each sorted, non-empty; block i's ids below block i+1's
}

// block returns the index of the block that holds id, or would.
func (x *idIndex) block(id string) int {
	i, _ := slices.BinarySearchFunc(x.blocks, id, func(b []string, id string) int { return strings.Compare(b[len(b)-1], id) })
	return min(i, len(x.blocks)-1)
}

func (x *idIndex) add(id string) {
	if len(x.blocks) == 0 {
		x.blocks = [][]string{{id}}
		return
	}
	bi := x.block(id)
	b := x.blocks[bi]
	i, found := slices.BinarySearch(b, id)
	if found {
		return
	}
	b = slices.Insert(b, i, id)
	if len(b) <= idBlock {
		x.blocks[bi] = b
		return
	}
	half := len(b) / 2
	x.blocks[bi] = slices.Clip(b[:half])
	x.blocks = slices.Insert(x.blocks, bi+1, slices.Clone(b[half:]))
}

func (x *idIndex) remove(id string) {
	if len(x.blocks) == 0 {
		return
	}
	bi := x.block(id)
	b := x.blocks[bi]
	i, found := slices.BinarySearch(b, id)
	if !found {
		return
	}
	if b = slices.Delete(b, i, i+1); len(b) == 0 {
		x.blocks = slices.Delete(x.blocks, bi, bi+1)
		return
	}
	x.blocks[bi] = b
}

// ascend calls fn with each id greater than after that starts with
// prefix, in order, until fn returns false.
func (x *idIndex) ascend(prefix, after string, fn func(id string) bool) {
	from := max(prefix, after)
	if len(x.blocks) == 0 {
		return
	}
	for bi := x.block(from); bi < len(x.blocks); bi++ {
		b := x.blocks[bi]
		i, _ := slices.BinarySearch(b, from)
		for _, id := range b[i:] {
			if id <= after {
				continue
			}
			if !strings.HasPrefix(id, prefix) || !fn(id) {
				return
			}
		}
	}
}

// indexID adds a task to its customer's idIndex.
func (v *views) indexID(t *task) {
	x := v.ids[t.customer]
	if x == nil {
		x = &idIndex{}
		v.ids[t.customer] = x
	}
	x.add(t.id)
}

// unindexID takes a task out of its customer's idIndex.
func (v *views) unindexID(t *task) {
	if x := v.ids[t.customer]; x != nil {
		if x.remove(t.id); len(x.blocks) == 0 {
			delete(v.ids, t.customer)
		}
	}
}
