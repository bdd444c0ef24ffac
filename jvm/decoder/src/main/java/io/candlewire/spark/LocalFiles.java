package io.candlewire.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system ({@code fs.file.impl}) without a program started per file. Without
 * Hadoop's native library, which no Maven artifact carries, {@link RawLocalFileSystem} sets the
 * mode of every file and directory it creates by running {@code chmod}: the stream job started
 * 162 of them in 30 s of a 3,000 ticks/s soak (Iceberg's data and metadata files, the queries'
 * checkpoints), each a {@code jspawnhelper} and a {@code chmod} forked from the job's JVM. Here
 * the mode is set by the JDK's own call. Checksums, renames and reads are Hadoop's.
 */
public final class LocalFiles extends LocalFileSystem {
  public LocalFiles() {
    super(new Raw());
  }

  /** The raw layer, with its one change. */
  static final class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission));
    }
  }

  /** A Hadoop mode as the JDK's permissions (sticky bit aside, as {@code chmod} is given it). */
  static Set<PosixFilePermission> posix(FsPermission permission) {
    Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
    add(out, permission.getUserAction(), PosixFilePermission.OWNER_READ,
        PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
    add(out, permission.getGroupAction(), PosixFilePermission.GROUP_READ,
        PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
    add(out, permission.getOtherAction(), PosixFilePermission.OTHERS_READ,
        PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
    return out;
  }

  private static void add(
      Set<PosixFilePermission> out,
      FsAction action,
      PosixFilePermission read,
      PosixFilePermission write,
      PosixFilePermission execute) {
    if (action.implies(FsAction.READ)) out.add(read);
    if (action.implies(FsAction.WRITE)) out.add(write);
    if (action.implies(FsAction.EXECUTE)) out.add(execute);
  }
}
