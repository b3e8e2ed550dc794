// Package lazyfs is a FUSE file system for power-cut tests, in the manner
// of Jepsen's LazyFS: it mounts over a backing directory and keeps every
// file's written data in memory, the way an operating system's page cache
// does, until an fsync (or fdatasync) of that file writes it to the
// backing directory. Cut simulates a power cut: every write not yet
// synced is dropped, and the file system refuses all further changes, so
// what the backing directory holds afterwards is exactly what a machine
// would find on its disk after losing power at that instant.
//
// The model, kept small and strict:
//
//   - File data and file size (writes, truncates, O_TRUNC) are cached per
//     file (per inode, so a rename keeps them) and reach the backing
//     file only when that file is fsynced, through any of its handles.
//     Closing a file syncs nothing.
//   - Reads see the cached data (read your writes): a read combines the
//     backing file with the cached pages, within the cached size.
//   - Directory operations (create, mkdir, rename, unlink, rmdir,
//     symlink, link) and attribute changes other than size go through
//     to the backing directory at once: they are durable when they
//     return. This is weaker than a real file system's journal (which can
//     lose a rename not followed by a directory fsync), so a program
//     that survives this model may still lose a just-created name on
//     real hardware; what it catches is the common failure, data
//     acknowledged before it was fsynced.
//   - Nothing is written back in the background, as a kernel's periodic
//     writeback would; Writeback does it when the test asks, so a test
//     can make "everything older than now" durable.
//   - The backing directory itself is not fsynced: the test simulates the
//     loss of the mount's cache, not of the real disk under it.
//
// Only tests and test tooling import this package (depguard says so).
// Mounting needs /dev/fuse and either root (Config.DirectMount, the
// default: mount(2) is called directly) or the fusermount helper.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// pageSize is the unit in which written data is cached.
const pageSize = 4096

// ErrNoFUSE is Mount's error where this process cannot mount a FUSE file
// system: /dev/fuse cannot be opened (the machine or container offers no
// FUSE), or the process is not root and has no fusermount helper.
var ErrNoFUSE = errors.New("lazyfs: FUSE is not available")

// Config says what to mount where.
type Config struct {
	// Backing is the directory that holds what survives a Cut. It must
	// exist.
	Backing string
	// Mountpoint is the directory the file system is mounted on. It must
	// exist, and should be empty.
	Mountpoint string
	// Fusermount, if set, mounts through the fusermount helper instead of
	// calling mount(2) directly, which needs root; a process that is not
	// root always uses the helper.
	Fusermount bool
	// Debug logs every FUSE request.
	Debug bool
}

// FS is a mounted lazyfs. Its methods are safe for concurrent use.
type FS struct {
	cfg    Config
	server *fuse.Server

	mu    sync.Mutex
	cut   bool              // the power is off: every change fails with EIO
	files map[uint64]*dirty // inode → its unsynced data
	stats Stats
}

// dirty is one file's unsynced state: the pages written since its last
// fsync, its size as the writer sees it, and keep, the length of the
// backing file's prefix still valid under the cached state (a truncate
// below the backing size hides the backing bytes after it, even if the
// file grows again).
type dirty struct {
	pages map[int64][]byte // page index → pageSize bytes
	size  int64
	keep  int64
	f     *os.File // the backing file, kept open for Writeback
}

// Stats counts the file system's work since Mount.
type Stats struct {
	Syncs        int   // fsyncs that wrote cached data to the backing directory
	SyncedBytes  int64 // bytes they wrote
	CutFiles     int   // files whose unsynced data Cut dropped
	CutBytes     int64 // the dropped pages' bytes (whole pages)
	DirtyFiles   int   // files with unsynced data now
	DirtyBytes   int64 // their cached pages' bytes now
	WrittenBytes int64 // bytes written through the mount
}

// Mount mounts a lazyfs of cfg.Backing on cfg.Mountpoint and returns once
// it serves requests. Unmount it when done.
func Mount(cfg Config) (*FS, error) {
	if cfg.Backing == "" || cfg.Mountpoint == "" {
		return nil, errors.New("lazyfs: Config.Backing and Config.Mountpoint are required")
	}
	if f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoFUSE, err)
	} else {
		f.Close()
	}
	if os.Geteuid() != 0 {
		cfg.Fusermount = true
	}
	if cfg.Fusermount {
		_, err3 := exec.LookPath("fusermount3")
		_, err := exec.LookPath("fusermount")
		if err3 != nil && err != nil {
			return nil, fmt.Errorf("%w: not root, and no fusermount3 or fusermount in PATH", ErrNoFUSE)
		}
	}
	backing, err := filepath.Abs(cfg.Backing)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: %w", err)
	}
	root, err := fs.NewLoopbackRoot(backing)
	if err != nil {
		return nil, fmt.Errorf("lazyfs: backing directory: %w", err)
	}
	lfs := &FS{cfg: cfg, files: make(map[uint64]*dirty)}
	rootNode := &node{LoopbackNode: root.(*fs.LoopbackNode), lfs: lfs}
	rootNode.RootData.RootNode = rootNode
	second := time.Second
	server, err := fs.Mount(cfg.Mountpoint, rootNode, &fs.Options{
		EntryTimeout: &second, AttrTimeout: &second, NegativeTimeout: &second,
		MountOptions: fuse.MountOptions{
			FsName: "lazyfs", Name: "lazyfs",
			DirectMountStrict: !cfg.Fusermount,
			Debug:             cfg.Debug,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("lazyfs: mount %s: %w", cfg.Mountpoint, err)
	}
	lfs.server = server
	return lfs, nil
}

// Cut simulates a power cut: it drops every write not yet synced, and
// from then on every change (write, fsync, create, rename, unlink, open)
// fails with EIO, as a dead disk would, until Unmount. An fsync running
// when Cut is called completes first or not at all. Cut returns the
// statistics at the moment of the cut; calling it again changes nothing.
func (l *FS) Cut() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		l.cut = true
		for ino, d := range l.files {
			l.stats.CutFiles++
			l.stats.CutBytes += int64(len(d.pages)) * pageSize
			l.drop(ino)
		}
	}
	return l.statsLocked()
}

// Writeback writes every file's unsynced data to the backing directory,
// as the kernel's periodic writeback of dirty pages (or sync(1)) does:
// what was written before the call survives a later Cut. It fails once
// the power is off.
func (l *FS) Writeback() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return fmt.Errorf("lazyfs: writeback: %w", syscall.EIO)
	}
	for ino, d := range l.files {
		if err := d.writeTo(d.f); err != nil {
			return fmt.Errorf("lazyfs: writeback: %w", err)
		}
		l.stats.Syncs++
		l.stats.SyncedBytes += int64(len(d.pages)) * pageSize
		l.drop(ino)
	}
	return nil
}

// drop forgets a file's unsynced state.
func (l *FS) drop(ino uint64) {
	if d := l.files[ino]; d != nil {
		d.f.Close()
		delete(l.files, ino)
	}
}

// Mountpoint is where the file system is mounted.
func (l *FS) Mountpoint() string { return l.cfg.Mountpoint }

// Stats returns the counts since Mount.
func (l *FS) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.statsLocked()
}

func (l *FS) statsLocked() Stats {
	s := l.stats
	s.DirtyFiles = len(l.files)
	for _, d := range l.files {
		s.DirtyBytes += int64(len(d.pages)) * pageSize
	}
	return s
}

// Unmount unmounts the file system; a process still holding a file open
// on it gets errors from then on. Unsynced data still cached (without a
// Cut: a clean unmount) is dropped too: unmount is not a sync.
func (l *FS) Unmount() error {
	l.mu.Lock()
	l.cut = true
	for ino := range l.files {
		l.drop(ino)
	}
	l.mu.Unlock()
	var err error
	for range 50 { // EBUSY while the kernel still releases files
		if err = l.server.Unmount(); err == nil {
			l.server.Wait()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("lazyfs: unmount %s: %w", l.cfg.Mountpoint, err)
}

// node is a loopback node whose regular files go through the cache.
type node struct {
	*fs.LoopbackNode
	lfs *FS
}

// The interfaces node overrides, beside those it inherits.
var (
	_ fs.NodeWrapChilder = (*node)(nil)
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeLookuper    = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeGetattrer   = (*node)(nil)
	_ fs.NodeSetattrer   = (*node)(nil)
	_ fs.NodeFsyncer     = (*node)(nil)
	_ fs.NodeTmpfiler    = (*node)(nil)
)

// WrapChild makes every node of the tree a lazyfs node.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), lfs: n.lfs}
}

// path is the node's backing path.
func (n *node) path() string {
	return filepath.Join(n.RootData.Path, n.Path(n.Root()))
}

// alive runs op unless the power is off. Holding the lock makes a
// directory operation happen wholly before or after a Cut.
func (n *node) alive(op func() syscall.Errno) syscall.Errno {
	n.lfs.mu.Lock()
	defer n.lfs.mu.Unlock()
	if n.lfs.cut {
		return syscall.EIO
	}
	return op()
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.alive(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mkdir(ctx, name, mode, out)
		return errno
	})
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.alive(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
		if errno == 0 {
			n.lfs.drop(ch.StableAttr().Ino) // a reused inode number starts clean
		}
		return errno
	})
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	errno = n.alive(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Symlink(ctx, target, name, out)
		return errno
	})
	return ch, errno
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (ch *fs.Inode, errno syscall.Errno) {
	if t, ok := target.(*node); ok {
		target = t.LoopbackNode
	}
	errno = n.alive(func() syscall.Errno {
		ch, errno = n.LoopbackNode.Link(ctx, target, name, out)
		return errno
	})
	return ch, errno
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.alive(func() syscall.Errno { return n.LoopbackNode.Rmdir(ctx, name) })
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.alive(func() syscall.Errno { return n.LoopbackNode.Unlink(ctx, name) })
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if p, ok := newParent.(*node); ok {
		newParent = p.LoopbackNode
	}
	return n.alive(func() syscall.Errno { return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags) })
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.alive(func() syscall.Errno { return n.LoopbackNode.Setxattr(ctx, attr, data, flags) })
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.alive(func() syscall.Errno { return n.LoopbackNode.Removexattr(ctx, attr) })
}

// Tmpfile (O_TMPFILE) is not offered: its handle would bypass the cache.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// Open opens the backing file read-write whatever the caller asked (a
// read-only handle may still be fsynced, and the sync writes through it);
// O_TRUNC becomes a cached truncate.
func (n *node) Open(ctx context.Context, flags uint32) (fh fs.FileHandle, fuseFlags uint32, errno syscall.Errno) {
	errno = n.alive(func() syscall.Errno {
		fh, errno = n.open(n.path(), n.StableAttr().Ino, flags)
		return errno
	})
	return fh, 0, errno
}

// Create creates the backing file at once (a directory operation), and
// opens it as Open does.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (ch *fs.Inode, fh fs.FileHandle, fuseFlags uint32, errno syscall.Errno) {
	errno = n.alive(func() syscall.Errno {
		var lf fs.FileHandle
		ch, lf, _, errno = n.LoopbackNode.Create(ctx, name, flags&^syscall.O_TRUNC, mode, out)
		if errno != 0 {
			return errno
		}
		lf.(fs.FileReleaser).Release(ctx)
		ino := ch.StableAttr().Ino
		n.lfs.drop(ino) // a reused inode number starts clean
		fh, errno = n.open(filepath.Join(n.path(), name), ino, flags)
		return errno
	})
	return ch, fh, 0, errno
}

// open opens path for the file handle of inode ino; it holds l.mu.
func (n *node) open(path string, ino uint64, flags uint32) (*handle, syscall.Errno) {
	if flags&syscall.O_DIRECTORY != 0 {
		return nil, syscall.EISDIR
	}
	base := int(flags) &^ (syscall.O_ACCMODE | syscall.O_APPEND | syscall.O_TRUNC | syscall.O_CREAT | syscall.O_EXCL | fuse.FMODE_EXEC)
	f, err := os.OpenFile(path, base|os.O_RDWR, 0)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	h := &handle{f: f, ino: ino, lfs: n.lfs}
	if flags&syscall.O_TRUNC != 0 {
		if errno := h.lfs.truncate(f, ino, 0); errno != 0 {
			f.Close()
			return nil, errno
		}
	}
	return h, 0
}

// Lookup reports the cached size of a file with unsynced data: the
// kernel takes a file's size from a lookup too.
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
	if errno == 0 {
		n.lfs.sizeOf(ch.StableAttr().Ino, &out.Attr)
	}
	return ch, errno
}

// Getattr reports the cached size of a file with unsynced data.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Getattr(ctx, out)
	}
	if errno := n.LoopbackNode.Getattr(ctx, nil, out); errno != 0 {
		return errno
	}
	n.lfs.sizeOf(n.StableAttr().Ino, &out.Attr)
	return 0
}

// Setattr caches a size change (truncate) and passes the others through.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return n.alive(func() syscall.Errno {
		ino := n.StableAttr().Ino
		if size, ok := in.GetSize(); ok {
			var bf *os.File
			if h, ok := f.(*handle); ok {
				bf = h.f
			} else {
				var err error
				if bf, err = os.OpenFile(n.path(), os.O_RDWR, 0); err != nil {
					return fs.ToErrno(err)
				}
				defer bf.Close()
			}
			if errno := n.lfs.truncate(bf, ino, int64(size)); errno != 0 {
				return errno
			}
			in.Valid &^= fuse.FATTR_SIZE
		}
		if errno := n.LoopbackNode.Setattr(ctx, nil, in, out); errno != 0 {
			return errno
		}
		if d := n.lfs.files[ino]; d != nil {
			out.Size = uint64(d.size)
		}
		return 0
	})
}

// Fsync writes a file's cached data to the backing file; a directory has
// nothing cached.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	return n.alive(func() syscall.Errno { return 0 })
}

// handle is an open regular file: its backing file, opened read-write.
type handle struct {
	f   *os.File
	ino uint64
	lfs *FS
}

var (
	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)
)

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.lfs.mu.Lock()
	defer h.lfs.mu.Unlock()
	n, errno := h.lfs.read(h.f, h.ino, dest, off)
	return fuse.ReadResultData(dest[:n]), errno
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.lfs.mu.Lock()
	defer h.lfs.mu.Unlock()
	if h.lfs.cut {
		return 0, syscall.EIO
	}
	d, errno := h.lfs.dirtyOf(h.f, h.ino)
	if errno != 0 {
		return 0, errno
	}
	for done := 0; done < len(data); {
		pos := off + int64(done)
		page, errno := h.lfs.page(h.f, d, pos/pageSize)
		if errno != 0 {
			return uint32(done), errno
		}
		done += copy(page[pos%pageSize:], data[done:])
	}
	d.size = max(d.size, off+int64(len(data)))
	h.lfs.stats.WrittenBytes += int64(len(data))
	return uint32(len(data)), 0
}

// Fsync writes the file's cached data and size to the backing file.
func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.lfs.mu.Lock()
	defer h.lfs.mu.Unlock()
	if h.lfs.cut {
		return syscall.EIO
	}
	d := h.lfs.files[h.ino]
	if d == nil {
		return 0
	}
	if err := d.writeTo(h.f); err != nil {
		return fs.ToErrno(err)
	}
	h.lfs.drop(h.ino)
	h.lfs.stats.Syncs++
	h.lfs.stats.SyncedBytes += int64(len(d.pages)) * pageSize
	return 0
}

// Flush (on close) syncs nothing, as close(2) does not.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	return fs.ToErrno(h.f.Close())
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(h.f.Fd()), &st); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStat(&st)
	h.lfs.sizeOf(h.ino, &out.Attr)
	return 0
}

// The cache. Every method below holds l.mu.

// sizeOf sets out's size to the cached one if the file has unsynced data.
func (l *FS) sizeOf(ino uint64, out *fuse.Attr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := l.files[ino]; d != nil {
		out.Size = uint64(d.size)
		out.Blocks = (out.Size + 511) / 512
	}
}

// dirtyOf returns the file's unsynced state, starting it from the backing
// file f if the file was clean.
func (l *FS) dirtyOf(f *os.File, ino uint64) (*dirty, syscall.Errno) {
	if d := l.files[ino]; d != nil {
		return d, 0
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	fd, err := syscall.Dup(int(f.Fd()))
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	d := &dirty{pages: make(map[int64][]byte), size: fi.Size(), keep: fi.Size(), f: os.NewFile(uintptr(fd), f.Name())}
	l.files[ino] = d
	return d, 0
}

// page returns page i of the file's cached data, reading it from the
// backing file f on first use.
func (l *FS) page(f *os.File, d *dirty, i int64) ([]byte, syscall.Errno) {
	if p := d.pages[i]; p != nil {
		return p, 0
	}
	p := make([]byte, pageSize)
	if errno := readBacking(f, d.keep, p, i*pageSize); errno != 0 {
		return nil, errno
	}
	d.pages[i] = p
	return p, 0
}

// read reads into dest at off what the writer would see: the backing
// file overlaid by the cached pages, up to the cached size.
func (l *FS) read(f *os.File, ino uint64, dest []byte, off int64) (int, syscall.Errno) {
	d := l.files[ino]
	if d == nil {
		n, err := f.ReadAt(dest, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return n, fs.ToErrno(err)
		}
		return n, 0
	}
	if off >= d.size {
		return 0, 0
	}
	n := int(min(int64(len(dest)), d.size-off))
	for done := 0; done < n; {
		pos := off + int64(done)
		i, in := pos/pageSize, pos%pageSize
		chunk := dest[done:min(n, done+int(pageSize-in))]
		if p := d.pages[i]; p != nil {
			copy(chunk, p[in:])
		} else if errno := readBacking(f, d.keep, chunk, pos); errno != 0 {
			return done, errno
		}
		done += len(chunk)
	}
	return n, 0
}

// truncate caches a size change of the file.
func (l *FS) truncate(f *os.File, ino uint64, size int64) syscall.Errno {
	d, errno := l.dirtyOf(f, ino)
	if errno != 0 {
		return errno
	}
	if size < d.size {
		for i, p := range d.pages {
			switch start := i * pageSize; {
			case start >= size:
				delete(d.pages, i)
			case start+pageSize > size:
				clear(p[size-start:])
			}
		}
		d.keep = min(d.keep, size)
	}
	d.size = size
	return 0
}

// writeTo makes the backing file f hold the cached state: what a truncate
// hid is cut off, the pages are written, and the size is set.
func (d *dirty) writeTo(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if d.keep < fi.Size() {
		if err := f.Truncate(d.keep); err != nil {
			return err
		}
	}
	for i, p := range d.pages {
		start := i * pageSize
		if start >= d.size {
			continue
		}
		if _, err := f.WriteAt(p[:min(pageSize, d.size-start)], start); err != nil {
			return err
		}
	}
	return f.Truncate(d.size)
}

// readBacking fills dest with the backing file's bytes at off, zeros past
// its end or past keep.
func readBacking(f *os.File, keep int64, dest []byte, off int64) syscall.Errno {
	clear(dest)
	if off >= keep {
		return 0
	}
	if _, err := f.ReadAt(dest[:min(int64(len(dest)), keep-off)], off); err != nil && !errors.Is(err, io.EOF) {
		return fs.ToErrno(err)
	}
	return 0
}
