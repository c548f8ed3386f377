"""Confined file operations, run INSIDE a sandbox as `python3 -I -c <this file's source> OP REL ...`.

Not imported by the console: `sandboxes.sessions.workspace` sends this source to the sandbox's own
python3 through the contract's exec, as the session user (uid 1000) for everything the user
asks, and as root only to stage attachments into the root-owned `input/`. It must run on the
oldest python3 a template carries (3.9 and up), with the standard library alone.

Every path is walked component by component from an open descriptor of /workspace, each
component opened relative to its parent with O_NOFOLLOW: a symbolic link anywhere on the way,
planted before the call or swapped in while it runs, fails the call instead of being
followed, so nothing outside /workspace is read, written or listed. `..` never appears (the
console refuses it first, and so does this helper). `prepare` (root, when a sandbox is made)
sets the layout's owners the same way, on descriptors, moving aside a link left in a
persistent workspace. Staging also checks that `input/` is
still the root-owned, not user-writable directory the image made (a user who owns
/workspace can rename it away and put a link or a folder of their own in its place), and
writes through a temporary name renamed into place, so no hard link is written through.

Exit codes (the message is on stderr): 0 done; 2 missing; 3 not a directory / a directory
where a file was expected / not a regular file; 4 a symbolic link on the way; 5 permission
denied; 6 input/ is not the staging folder; 7 bad request; 8 too many entries.
"""

import errno
import json
import os
import stat
import sys
import time

ROOT = "/workspace"
MISSING, WRONG_KIND, LINK, DENIED, STAGING, BAD, TOO_MANY = 2, 3, 4, 5, 6, 7, 8
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO never hangs us
TREE_MAX_ENTRIES = 20000
TREE_MAX_DEPTH = 64


class Refused(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def parts_of(relative):
    parts = [part for part in relative.split("/") if part not in ("", ".")]
    if ".." in parts or "\x00" in relative:
        raise Refused(BAD, "the path leaves /workspace")
    return parts


def shown(parts):
    return "/".join([ROOT, *parts])


def refusal(error, parts, parent_fd=None):
    """The Refused for an OSError met at `parts` (looking whether a link was in the way)."""
    code = error.errno
    if code == errno.ELOOP:
        return Refused(LINK, shown(parts) + " is a symbolic link; links are not followed")
    if code in (errno.ENOTDIR, errno.EISDIR, errno.ENXIO) and parent_fd is not None:
        try:
            if stat.S_ISLNK(os.stat(parts[-1], dir_fd=parent_fd, follow_symlinks=False).st_mode):
                return Refused(LINK, shown(parts) + " is a symbolic link; links are not followed")
        except OSError:
            pass
    if code == errno.ENOENT:
        return Refused(MISSING, shown(parts) + ": no such file or directory")
    if code in (errno.ENOTDIR, errno.EISDIR, errno.ENXIO):
        return Refused(WRONG_KIND, shown(parts) + ": " + os.strerror(code).lower())
    if code in (errno.EACCES, errno.EPERM):
        return Refused(DENIED, shown(parts) + ": permission denied")
    return Refused(BAD, shown(parts) + ": " + os.strerror(code))


def open_root():
    try:
        return os.open(ROOT, DIR_FLAGS)
    except OSError as error:
        raise refusal(error, []) from None


def check_staging(fd, parts):
    info = os.fstat(fd)
    if info.st_uid != 0 or info.st_mode & 0o022:
        raise Refused(
            STAGING,
            shown(parts) + " is not the console's staging folder any more (replaced or made "
            "writable by the session user); rebuild the session to restore it",
        )


def walk(parts, create=False, staging=False):
    """A descriptor of the directory at `parts`, never through a link."""
    fd = open_root()
    for depth, name in enumerate(parts):
        here = parts[: depth + 1]
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                os.close(fd)
                raise Refused(MISSING, shown(here) + ": no such file or directory") from None
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                failure = refusal(error, here, fd)
                os.close(fd)
                raise failure from None
        except OSError as error:
            failure = refusal(error, here, fd)
            os.close(fd)
            raise failure from None
        os.close(fd)
        fd = child
        if staging:
            check_staging(fd, here)
    return fd


def printable(text):
    """A name as JSON can carry it: bytes that are not UTF-8 shown as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def describe(info, name, path):
    return {
        "path": printable(path),
        "name": printable(name),
        "dir": stat.S_ISDIR(info.st_mode),
        "link": stat.S_ISLNK(info.st_mode),
        "size": info.st_size,
        "mode": stat.S_IMODE(info.st_mode),
        "mtime": info.st_mtime,
    }


def do_stat(parts):
    if not parts:
        fd = open_root()
        return describe(os.fstat(fd), "workspace", ROOT)
    fd = walk(parts[:-1])
    try:
        info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
    except OSError as error:
        raise refusal(error, parts) from None
    return describe(info, parts[-1], shown(parts))


def do_list(parts):
    fd = walk(parts)
    rows = []
    names = os.listdir(fd)
    if len(names) > TREE_MAX_ENTRIES:
        raise Refused(TOO_MANY, f"{shown(parts)} has more than {TREE_MAX_ENTRIES} entries")
    for name in sorted(names):
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while listing
        rows.append(describe(info, name, shown([*parts, name])))
    return rows


def open_file(parts, flags, mode=0o644, create_parents=False, staging=False):
    if not parts:
        raise Refused(WRONG_KIND, ROOT + " is a directory")
    parent = walk(parts[:-1], create=create_parents, staging=staging)
    try:
        fd = os.open(parts[-1], flags | FILE_FLAGS, mode, dir_fd=parent)
    except OSError as error:
        raise refusal(error, parts, parent) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise Refused(WRONG_KIND, shown(parts) + " is not a regular file")
    return parent, fd


def do_read(parts, limit):
    _, fd = open_file(parts, os.O_RDONLY)
    os.set_blocking(fd, True)
    left = limit
    out = sys.stdout.buffer
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        out.write(chunk)
        left -= len(chunk)
    out.flush()


def do_write(parts, mode):
    data = sys.stdin.buffer.read()
    _, fd = open_file(parts, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode, create_parents=True)
    os.set_blocking(fd, True)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fchmod(fd, mode)
    return describe(os.fstat(fd), parts[-1], shown(parts))


def do_stage(parts, mode):
    """As root: a new file under the root-owned input/, renamed into place."""
    if len(parts) < 2 or parts[0] != "input":
        raise Refused(BAD, "staging writes under /workspace/input only")
    data = sys.stdin.buffer.read()
    parent = walk(parts[:-1], create=True, staging=True)
    temporary = f".console-staging-{os.getpid()}"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS, 0o600, dir_fd=parent)
    except OSError as error:
        raise refusal(error, [*parts[:-1], temporary], parent) from None
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchown(fd, 0, 0)
        os.fchmod(fd, mode)
        os.rename(temporary, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    except OSError as error:
        os.unlink(temporary, dir_fd=parent)
        raise refusal(error, parts) from None
    return describe(os.fstat(fd), parts[-1], shown(parts))


def do_tree(parts):
    """Every entry under the directory, depth first, without following any link."""
    found: list = []

    def visit(fd, prefix, depth):
        with os.scandir(fd) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if len(found) >= TREE_MAX_ENTRIES:
                    raise Refused(TOO_MANY, f"more than {TREE_MAX_ENTRIES} entries under {shown(parts)}")
                relative = prefix + entry.name
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kind = "d" if stat.S_ISDIR(info.st_mode) else "f" if stat.S_ISREG(info.st_mode) else "l"
                if not stat.S_ISLNK(info.st_mode) and kind == "l":
                    kind = "o"  # a FIFO, socket or device
                found.append({"path": printable(relative), "kind": kind, "size": info.st_size})
                if printable(relative) != relative:
                    found[-1]["kind"] = "name"  # not UTF-8: it could not be asked for again
                elif kind == "d" and depth < TREE_MAX_DEPTH:
                    try:
                        child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                    except OSError:
                        found[-1]["kind"] = "changed"  # swapped for a link meanwhile
                        continue
                    try:
                        visit(child, relative + "/", depth + 1)
                    finally:
                        os.close(child)

    try:
        top = walk(parts)
    except Refused as refused:
        if refused.code == MISSING:
            return []
        raise
    visit(top, "", 0)
    return found


def move_aside(root, name):
    """Rename `name` to a name nobody holds: the user may have made folders (or files) of
    the names a plain `<name>.replaced-<time>` would take, to make the rename fail or eat them."""
    for _ in range(100):
        aside = f"{name}.replaced-{int(time.time())}-{os.urandom(4).hex()}"
        try:
            os.stat(aside, dir_fd=root, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(name, aside, src_dir_fd=root, dst_dir_fd=root)
            return
    raise Refused(BAD, shown([name]) + " could not be moved aside")


def open_or_remake(root, name):
    """The folder `name` under /workspace; a link or file there is moved aside, not followed."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=root)
    except FileNotFoundError:
        pass
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise refusal(error, [name]) from None
        move_aside(root, name)
    os.mkdir(name, 0o755, dir_fd=root)
    return os.open(name, DIR_FLAGS, dir_fd=root)


def do_prepare(uid):
    """As root, at create: /workspace and output/ the user's, input/ root's and 0755.

    A persistent workspace carries whatever the user left in it; owners and modes are set
    on descriptors opened without following links, so no link makes root chown /etc.
    """
    root = open_root()
    os.fchown(root, uid, uid)
    for name, owner in (("input", 0), ("output", uid)):
        fd = open_or_remake(root, name)
        os.fchown(fd, owner, owner)
        if owner == 0:
            os.fchmod(fd, 0o755)
        os.close(fd)
    return {"prepared": ROOT}


def remove_tree(parent, name):
    """Remove `name` under the open directory `parent`: a folder with all it holds, depth
    first, each folder opened without following links; a link is removed, never followed."""
    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            remove_tree(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


# The layout's own folders: a delete or rename of these is refused (`prepare` remakes them).
KEPT = (["input"], ["output"])


def do_delete(parts):
    if not parts or parts in KEPT:
        raise Refused(BAD, shown(parts) + " is part of the workspace's layout and is not deleted")
    parent = walk(parts[:-1])
    try:
        remove_tree(parent, parts[-1])
    except OSError as error:
        raise refusal(error, parts, parent) from None
    return {"deleted": shown(parts)}


def do_rename(parts, target):
    """Rename within /workspace: `target` is relative to it too; an existing target is kept."""
    to = parts_of(target)
    if not parts or not to or parts in KEPT or to in KEPT:
        raise Refused(BAD, "the workspace's own folders are not renamed, nor renamed onto")
    source, destination = walk(parts[:-1]), walk(to[:-1])
    try:
        os.stat(to[-1], dir_fd=destination, follow_symlinks=False)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise refusal(error, to, destination) from None
    else:
        raise Refused(BAD, shown(to) + " already exists")
    try:
        os.rename(parts[-1], to[-1], src_dir_fd=source, dst_dir_fd=destination)
        info = os.stat(to[-1], dir_fd=destination, follow_symlinks=False)
    except OSError as error:
        raise refusal(error, parts, source) from None
    return describe(info, to[-1], shown(to))


def do_mkdir(parts):
    if not parts:
        raise Refused(BAD, ROOT + " exists")
    parent = walk(parts[:-1])
    try:
        os.mkdir(parts[-1], 0o755, dir_fd=parent)
        info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    except FileExistsError:
        raise Refused(BAD, shown(parts) + " already exists") from None
    except OSError as error:
        raise refusal(error, parts, parent) from None
    return describe(info, parts[-1], shown(parts))


def main(argv):
    if len(argv) < 2:
        raise Refused(BAD, "usage: OP PATH [ARG]")
    op, parts = argv[0], parts_of(argv[1])
    if op == "stat":
        answer = do_stat(parts)
    elif op == "list":
        answer = do_list(parts)
    elif op == "tree":
        answer = do_tree(parts)
    elif op == "read":
        do_read(parts, int(argv[2]))
        return
    elif op == "write":
        answer = do_write(parts, int(argv[2], 8))
    elif op == "delete":
        answer = do_delete(parts)
    elif op == "rename":
        answer = do_rename(parts, argv[2])
    elif op == "mkdir":
        answer = do_mkdir(parts)
    elif op == "stage":
        answer = do_stage(parts, int(argv[2], 8))
    elif op == "prepare":
        answer = do_prepare(int(argv[2]))
    else:
        raise Refused(BAD, "unknown operation " + op)
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Refused as refused:
        sys.stderr.write(str(refused) + "\n")
        sys.exit(refused.code)
    except OSError as error:  # a race the walk did not foresee: still a clear answer
        sys.stderr.write(f"{error}\n")
        sys.exit(BAD)
