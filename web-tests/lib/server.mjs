// Starts a blobstream server for the browser tests: `$BLOBSTREAM_BIN serve --memory` (or on disk) on
// loopback ports chosen by the OS, waits for the line announcing the web address, and stops
// the server again. One server per test file; each starts empty apart from the samples the
// server seeds (samples/ct-phantom.dcm, samples/test-card.png, samples/xray-16bit.png).

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';

/** Root of the repository (web-tests/lib/ -> ../..). */
export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

const WEB_LINE = /web \(HTTP\):\s+(http:\/\/\S+)/;

function tail(s, n = 4000) {
  return s.length > n ? `…${s.slice(-n)}` : s;
}

/**
 * Start the server. Resolves to {url, stop, output, dataDir} where url ends with '/'
 * (e.g. http://127.0.0.1:41234/), stop() ends the process, and dataDir is the data directory
 * of a server started `onDisk` (null for one in memory).
 */
export async function startServer({ timeoutMs = 60_000, args = [], onDisk = false } = {}) {
  const bin = path.resolve(repoRoot, process.env.BLOBSTREAM_BIN || 'target/debug/blobstream');
  if (!existsSync(bin)) {
    throw new Error(`${bin} not found: build it first (cargo build -p blobstream) or set BLOBSTREAM_BIN`);
  }
  // A scratch working directory, so nothing the server writes lands in the repository.
  const cwd = await mkdtemp(path.join(tmpdir(), 'blobstream-web-'));
  // On disk (`onDisk`), the data directory is `dataDir` in it, for a test that reaches in.
  const dataDir = path.join(cwd, 'data');
  const store = onDisk ? ['--data', dataDir] : ['--memory'];
  const argv = ['serve', ...store, '--addr', '127.0.0.1:0', '--http', '127.0.0.1:0', ...args];
  const child = spawn(bin, argv, { cwd, stdio: ['ignore', 'pipe', 'pipe'], env: process.env });
  const output = { stdout: '', stderr: '' };
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d) => {
    output.stderr = tail(output.stderr + d, 64_000);
  });

  let exited = false;
  const exitedPromise = new Promise((resolve) => {
    child.on('exit', (code, signal) => {
      exited = true;
      resolve({ code, signal });
    });
  });

  const url = await new Promise((resolve, reject) => {
    const lines = readline.createInterface({ input: child.stdout });
    let found = false;
    const timer = setTimeout(() => {
      reject(
        new Error(
          `blobstream serve printed no "web (HTTP): URL" line within ${timeoutMs / 1000} s\n` +
            `command: ${bin} ${argv.join(' ')}\nstdout:\n${tail(output.stdout)}\nstderr:\n${tail(output.stderr)}`,
        ),
      );
      child.kill('SIGKILL');
    }, timeoutMs);
    // Keep reading stdout after the match so the server never blocks on a full pipe.
    lines.on('line', (line) => {
      output.stdout = tail(`${output.stdout}${line}\n`, 64_000);
      const m = WEB_LINE.exec(line);
      if (m && !found) {
        found = true;
        clearTimeout(timer);
        resolve(m[1].endsWith('/') ? m[1] : `${m[1]}/`);
      }
    });
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${bin}: ${e.message}`));
    });
    exitedPromise.then(({ code, signal }) => {
      if (found) return;
      clearTimeout(timer);
      reject(
        new Error(
          `blobstream serve exited (code ${code}, signal ${signal}) before announcing its web address\n` +
            `command: ${bin} ${argv.join(' ')}\nstdout:\n${tail(output.stdout)}\nstderr:\n${tail(output.stderr)}`,
        ),
      );
    });
  });

  async function stop() {
    if (!exited) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => {
        if (!exited) child.kill('SIGKILL');
      }, 5_000);
      await exitedPromise;
      clearTimeout(timer);
    }
    await rm(cwd, { recursive: true, force: true });
  }

  return { url, stop, output, dataDir: onDisk ? dataDir : null };
}
